"""The layers in DESIGN.md hold: spot_core imports no engine or cloud SDK at import time,
no module imports itself back through a cycle, and no arrow runs up the floors.

The import graph is read statically with ``ast`` from every module of spot_core,
airflow_spot, prefect_spot and spot_emulators (emulators/, the second distribution),
imports inside functions included (a lazy import is still a dependency; only the moment it
is paid changes).
"""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Each package's folder: spot_emulators is the distribution built from emulators/.
PACKAGES = {
    "spot_core": REPO,
    "airflow_spot": REPO,
    "prefect_spot": REPO,
    "spot_emulators": REPO / "emulators",
}

FORBIDDEN = {
    "airflow",
    "prefect",
    "boto3",
    "botocore",
    "kubernetes",
    "torch",
    "airflow_spot",
    "prefect_spot",
}

# Bottom first. A floor holds sibling groups; a group is one prefix or a tuple of prefixes.
# A module may import its own group and any group on a lower floor; never a sibling on its
# own floor, never a higher floor.
FLOORS: tuple[tuple[str | tuple[str, ...], ...], ...] = (
    (
        "spot_core",
        "spot_core.errors",
        "spot_core.credentials",
        "spot_core.stopping",
        "spot_core.bounds",
    ),  # stdlib only
    (
        ("spot_core.model", "spot_core.attempt_env"),
        "spot_core.safe_files",  # safe_files: users' files
        "spot_core.durations",
        "spot_core.plugins",
    ),  # "90s"; entry points
    ("spot_core.adaptors",),  # lazy cloud SDKs
    ("spot_core.checkpoint", "spot_core.market", "spot_core.interruption"),
    (
        "spot_core.policy",
        "spot_core.container",
        "spot_core.workloads",
        "spot_core.charts",
        "spot_core.fleet",
    ),  # charts: model -> SVG; fleet: records -> figures
    ("spot_core.localcloud",),  # nodes are processes with a metadata emulator
    # the local one uses localcloud; the emulators (not in the wheel) run nodes the same way
    ("spot_core.providers", "spot_emulators"),
    ("spot_core.settings",),  # checks provider/policy names
    ("spot_core.observer", "spot_core.batched"),  # batched watching
    # run() watches through an observer; controller re-exports the lifecycle package
    (("spot_core.controller", "spot_core.lifecycle"),),
    ("spot_core.jobs",),  # a job assembled once
    ("spot_core.sweeps",),  # Optuna studies whose trials are spot jobs
    ("spot_core.sim", "spot_core.demo", "spot_core.report"),
    (("spot_core.cli", "spot_core.commands"),),  # cli loads commands by name
    ("airflow_spot", "prefect_spot"),  # never import each other
)
# The package root holds only __version__: every subpackage of spot_core must be placed.
EXACT_ONLY = {"spot_core"}

# Edges left out of the cycle check, each with its reason. Keep this empty where possible.
CYCLE_EXCEPTIONS: set[tuple[str, str]] = set()


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package __init__)."""
    found = {}
    for package, root in PACKAGES.items():
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _known(name: str, modules) -> str | None:
    """The deepest of our modules that ``name`` lies in (a name may be a function)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imported(node: ast.AST, here: str, is_package: bool, modules) -> set[str]:
    """Our modules one import statement loads."""
    if isinstance(node, ast.Import):
        return {m for a in node.names if (m := _known(a.name, modules))}
    if not isinstance(node, ast.ImportFrom):
        return set()
    base = node.module or ""
    if node.level:
        package = here.split(".") if is_package else here.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join(package + ([node.module] if node.module else []))
    targets = set()
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        target = submodule if submodule in modules else _known(base, modules)
        if target:
            targets.add(target)
    return targets


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports anywhere in its body."""
    modules = _modules()
    graph = {}
    for name, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        targets = set().union(*(_imported(n, name, is_package, modules) for n in ast.walk(tree)))
        graph[name] = targets - {name}
    return graph


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module (each holds at least one cycle)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _one_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A concrete cycle inside one component, for the failure message."""
    inside = {v: graph[v] & set(component) for v in component}
    try:
        graphlib.TopologicalSorter(inside).prepare()
    except graphlib.CycleError as exc:
        return list(reversed(exc.args[1]))  # graphlib lists dependents first
    raise AssertionError(f"component {component} has no cycle")


def _group_of(module: str) -> tuple[int, str]:
    """(floor, group name) of ``module``; the longest matching prefix wins."""
    best = None
    for floor, groups in enumerate(FLOORS):
        for group in groups:
            for prefix in (group,) if isinstance(group, str) else group:
                exact = prefix in EXACT_ONLY
                if module == prefix or (not exact and module.startswith(prefix + ".")):
                    if best is None or len(prefix) > len(best[2]):
                        best = (floor, str(group), prefix)
    assert best is not None, f"{module} is on no floor; add it to FLOORS in {__file__}"
    return best[0], best[1]


def test_core_imports_no_engine_or_cloud_sdk():
    code = (
        "import spot_core.cli, spot_core.model, spot_core.checkpoint, spot_core.interruption\n"
        "import sys; print('\\n'.join(sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    loaded = {name.split(".")[0] for name in out.stdout.split()}
    assert not loaded & FORBIDDEN


def test_the_graph_sees_lazy_and_relative_imports():
    """Guards the other tests from passing on an empty graph."""
    graph = import_graph()
    assert len(graph) > 80
    # imported inside LocalProvider.connect
    assert "spot_core.localcloud.client" in graph["spot_core.providers.local"]
    # the SDK edge goes through the adaptors floor
    assert "spot_core.adaptors.aws" in graph["spot_core.checkpoint.s3_backend"]
    assert "spot_core.controller" in graph["spot_core.demo.pipeline"]
    # the second distribution's modules, and the demo's lazy import of them
    assert "spot_core.localcloud.metadata" in graph["spot_emulators.kubernetes.cluster"]
    assert "spot_emulators.kubernetes" in graph["spot_core.demo.kubernetes"]


def test_no_import_cycle():
    graph = {
        m: {t for t in ts if (m, t) not in CYCLE_EXCEPTIONS} for m, ts in import_graph().items()
    }
    cycles = [" -> ".join(_one_cycle(graph, c)) for c in _strongly_connected(graph)]
    assert not cycles, "import cycles (move the shared code down a floor):\n" + "\n".join(cycles)


def test_no_upward_or_sideways_import():
    bad = []
    for module, targets in sorted(import_graph().items()):
        floor, group = _group_of(module)
        for target in sorted(targets):
            t_floor, t_group = _group_of(target)
            if t_group != group and t_floor >= floor:
                how = "up" if t_floor > floor else "sideways to a sibling"
                bad.append(f"{module} ({group}) imports {target} ({t_group}): {how}")
    assert not bad, "imports against the floors in test_layering.FLOORS:\n" + "\n".join(bad)


# What each provider knows lives in its module: the engines and the commands reach providers
# only through the spot_core.jobs façade (its plugin, its capabilities), never by import.
THROUGH_THE_FACADE = ("airflow_spot", "prefect_spot", "spot_core.commands", "spot_core.cli")


def _under(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_engines_and_commands_reach_providers_only_through_the_jobs_facade():
    bad = [
        f"{module} imports {target}"
        for module, targets in sorted(import_graph().items())
        if _under(module, THROUGH_THE_FACADE)
        for target in sorted(targets)
        if _under(target, ("spot_core.providers",))
    ]
    assert not bad, (
        "import spot_core.jobs instead (engines and commands never import a "
        "provider):\n" + "\n".join(bad)
    )


def test_every_exception_is_still_needed():
    graph = import_graph()
    stale = [edge for edge in CYCLE_EXCEPTIONS if edge[1] not in graph.get(edge[0], ())]
    assert not stale, f"remove these from CYCLE_EXCEPTIONS, the imports are gone: {stale}"


# spot_emulators is a separate distribution (the extra [emulators]), not installed with the
# product: only the demos may use it, and only inside the function that runs the emulated
# cluster (or for type checking), so that importing a demo module never needs it.
USES_THE_EMULATORS = ("spot_core.demo", "airflow_spot.demo")


def _run_at_import(tree: ast.Module) -> list[ast.AST]:
    """The statements a module runs when imported: not function bodies, not the
    ``if TYPE_CHECKING:`` blocks; class bodies and other blocks included."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        ):
            todo.extend(node.orelse)
            continue
        found.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return found


def test_the_product_imports_the_emulators_only_lazily_and_only_in_its_demos():
    modules = _modules()
    bad = []
    for module, (path, is_package) in sorted(modules.items()):
        if _under(module, ("spot_emulators",)):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        eager = set(map(id, _run_at_import(tree)))
        for node in ast.walk(tree):
            targets = _imported(node, module, is_package, modules)
            if not any(_under(t, ("spot_emulators",)) for t in targets):
                continue
            if not _under(module, USES_THE_EMULATORS):
                bad.append(f"{module}:{node.lineno} (only {USES_THE_EMULATORS} may)")
            elif id(node) in eager:
                bad.append(f"{module}:{node.lineno} (at import time: import it in the function)")
    assert not bad, (
        "spot_emulators is the separate distribution spot-pipelines-emulators; these "
        "imports need it:\n" + "\n".join(bad)
    )
