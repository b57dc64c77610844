"""`make images` and these tests on a machine whose podman has only its defaults.

podman's default OCI runtime, crun, refuses machines whose cgroups v1 and v2 are mounted
together ("cgroups in hybrid mode not supported"), and a build's first RUN failed there.
The build and the tests' podman service now run with a containers.conf of their own, with
the first runtime that runs a container here (the default, else runc); the machine's
configuration is left alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.docker_build import build_images

pytestmark = pytest.mark.timeout(600)

MACHINE_CONF = Path("/etc/containers/containers.conf")


def _machine_conf() -> bytes | None:
    return MACHINE_CONF.read_bytes() if MACHINE_CONF.exists() else None


@pytest.mark.parametrize("program", ["podman", "buildah"])
def test_a_build_runs_its_steps_where_podman_has_only_its_defaults(
    program, engine, images, tmp_path, monkeypatch
):
    if engine.kind == "docker":
        pytest.skip("a Docker daemon is this machine's engine: podman's runtime is not used")
    assert shutil.which(program), f"{program} is not installed (tests/system-packages)"
    monkeypatch.delenv("CONTAINERS_CONF", raising=False)
    before = _machine_conf()
    builder = build_images.Engine(program)
    builder.configure(tmp_path / "engine")  # what `make images` does
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        f"FROM {images.bases['PYTHON_IMAGE']}\n"
        "RUN python3 -c \"open('/tmp/ran', 'w').write('a RUN step ran')\"\n"
    )
    ref = f"localhost/spot-pipelines-runtime-check-{program}:dev"
    try:
        builder.build(dockerfile, tmp_path, ref, {}, {})
        assert builder.inspect(ref) is not None
    finally:
        builder.run("rmi", ref, check=False)
    assert _machine_conf() == before, "the machine's own containers.conf was changed"


def test_no_runtime_that_runs_a_container_is_one_line_naming_the_fix(engine, tmp_path, monkeypatch):
    if engine.kind == "docker":
        pytest.skip("a Docker daemon is this machine's engine: podman's runtime is not used")
    monkeypatch.delenv("CONTAINERS_CONF", raising=False)
    monkeypatch.setattr(build_images, "RUNTIMES", ("no-such-runtime",))
    with pytest.raises(build_images.BuildError) as caught:
        build_images.Engine("podman").configure(tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    assert "no-such-runtime" in message and "apt-get install runc" in message
