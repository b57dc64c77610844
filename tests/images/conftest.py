"""tests/images: the project's images and its compose stack under a real container engine
(`make test-images`; `make test` runs it).

The session starts what it needs: podman's Docker API for the real `docker` CLI (or a
Docker daemon when one answers), and `make images` (docker/build_images.py), which builds
nothing when the images are current with this checkout."""

from __future__ import annotations

import shutil
from dataclasses import dataclass

import pytest

from tests.support.container_engine import EngineEnv, docker_daemon, podman_service
from tests.support.docker_build import build_images


@dataclass(frozen=True)
class Images:
    step: str
    airflow: str
    prefect: str
    bases: dict[str, str]  # build argument / compose variable -> the image used


@pytest.fixture(scope="session")
def engine(tmp_path_factory) -> EngineEnv:
    """A Docker API the docker CLI talks to, for the whole session."""
    if shutil.which("docker") is None:
        pytest.fail(
            "the container tests drive the real docker CLI, and none is on PATH: "
            "install docker's CLI (Debian/Ubuntu: apt-get install docker.io)"
        )
    if docker_daemon():
        yield EngineEnv("docker", {})
        return
    if shutil.which("podman") is None:
        pytest.fail(
            "no Docker daemon answers and podman is missing: apt-get install podman "
            "buildah (make test does it when run as root on Debian/Ubuntu)"
        )
    try:
        with podman_service(tmp_path_factory.mktemp("engine")) as found:
            yield found
    except build_images.BuildError as exc:
        pytest.fail(f"make test-images: {exc}")


@pytest.fixture(scope="session")
def images(engine) -> Images:
    """The three images, current with this checkout (built now if they are not)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in engine.environ.items():
            patch.setenv(name, value)
        try:
            bases, lines = build_images.build()
        except build_images.BuildError as exc:
            pytest.fail(f"make images: {exc}")
    print("\n".join(lines))
    refs = {image.name: image.ref for image in build_images.IMAGES}
    return Images(refs["step"], refs["airflow"], refs["prefect"], dict(bases.refs))
