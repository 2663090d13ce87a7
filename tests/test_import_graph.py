"""The direction of imports (docs/architecture.md, "Direction of imports"), computed from the code.

Every ``import`` and ``from ... import`` of every module under the four folders and the
``vramscope`` facade is read with ``ast`` — module level, inside functions and under
``if TYPE_CHECKING:`` alike — and mapped to installed names (``agent/x.py`` is
``vramscope.agent.x``). The rules:

- the hooks import only the hooks and the shared core (:data:`CORE`), and the core imports only
  itself: whatever an inference server loads of ours stays in that set;
- analysis never imports alerts (alerts are built on analysis, not the other way round);
- the dashboard never reaches the hooks, torch or pynvml, not even through the agent;
- the dashboard runs no alert engine: it never reaches the offline driver and imports nothing
  of the engine that evaluates (it reads what the engine stored);
- no import cycle between modules (imports under ``TYPE_CHECKING`` do not run, so they are
  left out of this one), other than Alembic's env.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"vramscope": "vramscope", "vramscope.agent": "agent", "vramscope.hooks": "hooks",
           "vramscope.dashboard": "dashboard", "vramscope.migrations": "migrations"}

# The shared language of the in-server hooks and the sidecar: the typed records, the trace
# format v1 that encodes them, the wire protocol that frames them, the clock seam (and its
# scheduler), the error types, the settings table (and the database URL check it names) and the
# dtype sizes. Small on purpose; docs/architecture.md says why each is here.
CORE = frozenset({
    "vramscope.agent.records", "vramscope.agent.trace", "vramscope.agent.ingest.protocol",
    "vramscope.agent.clock", "vramscope.agent.errors", "vramscope.agent.config",
    "vramscope.agent.dtypes", "vramscope.agent.timefmt", "vramscope.agent.settings",
    "vramscope.agent.database_url",
})
# Packages whose __init__ runs on the way to a core module; each must stay import-free.
CORE_PACKAGES = frozenset({"vramscope", "vramscope.agent", "vramscope.agent.ingest"})
VENDOR_ONLY_IN_SERVER = ("torch", "pynvml")
# Alembic's env.py imports the schema that the store upgrades through Alembic (by path).
ALLOWED_CYCLE_MEMBERS = frozenset({"vramscope.migrations.env"})


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


MODULES = _modules()


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:``."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out |= {id(n) for body in node.body for n in ast.walk(body)}
    return out


def _resolve(name: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str, path: Path, *, runtime_only: bool = False) -> set[str]:
    """Every module ``name`` imports: first-party ones by installed name, others by top level."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skip = _type_checking_nodes(tree) if runtime_only else set()
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(name, path, node)
            for alias in node.names:  # `from pkg import mod` imports the module pkg.mod
                sub = f"{module}.{alias.name}"
                out.add(sub if sub in MODULES else module)
    return {m if m.split(".")[0] == "vramscope" else m.split(".")[0] for m in out}


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items()}
RUNTIME_GRAPH = {name: imports_of(name, path, runtime_only=True)
                 for name, path in MODULES.items()}


def _with_parents(name: str) -> set[str]:
    """The module and every package whose ``__init__`` runs on the way to it."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def reachable(start: set[str], graph: dict[str, set[str]]) -> set[str]:
    seen: set[str] = set()
    todo = [p for s in start for p in _with_parents(s)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for target in graph.get(name, ()):
            todo += [p for p in _with_parents(target) if p not in seen]
    return seen


def under(package: str) -> set[str]:
    return {m for m in MODULES if m == package or m.startswith(package + ".")}


def test_the_graph_sees_every_kind_of_import():
    assert "vramscope.agent.records" in GRAPH["vramscope.hooks.phase"]  # module level
    assert "vramscope.agent.alerts.engine" in GRAPH["vramscope.agent.cli.cmd_import"]  # function
    assert "vramscope.agent.estimate" in GRAPH["vramscope.dashboard.views"]  # from pkg import m
    assert len(MODULES) > 100 and all(m in MODULES for m in CORE | CORE_PACKAGES)


def test_nothing_imports_a_folder_by_its_bare_name():
    """``from agent.x import y`` works only from a checkout and clashes with a user's agent.py."""
    bare = set(FOLDERS.values()) - {"vramscope"}
    wrong = {f"{m} -> {t}" for m, targets in GRAPH.items() for t in targets if t in bare}
    assert sorted(wrong) == []


def test_the_product_never_imports_the_checkout_s_tools():
    """tools/ (benchmarks, generators) is not installed, so an import of it fails from a wheel;
    ``vramscope bench`` finds it by path at run time, from a checkout (agent/cli/cmd_bench.py)."""
    wrong = {f"{m} -> {t}" for m, targets in GRAPH.items() for t in targets if t == "tools"}
    assert sorted(wrong) == []


def test_the_hooks_import_only_the_hooks_and_the_shared_core():
    hooks = under("vramscope.hooks")
    wrong = {f"{m} -> {t}" for m in hooks for t in GRAPH[m]
             if t.startswith("vramscope.") and t not in hooks and t not in CORE}
    assert sorted(wrong) == []


def test_the_core_imports_only_the_core():
    wrong = {f"{m} -> {t}" for m in CORE | CORE_PACKAGES for t in GRAPH[m]
             if t.startswith("vramscope") and t not in CORE}
    assert sorted(wrong) == []


def test_what_a_server_can_load_of_ours_is_the_hooks_and_the_core():
    loaded = {m for m in reachable(under("vramscope.hooks"), GRAPH) if m.startswith("vramscope")}
    assert loaded <= under("vramscope.hooks") | CORE | CORE_PACKAGES


def test_analysis_imports_nothing_from_alerts():
    wrong = {f"{m} -> {t}" for m in under("vramscope.agent.analysis") for t in GRAPH[m]
             if t.startswith("vramscope.agent.alerts")}
    assert sorted(wrong) == []


def test_only_the_store_reader_chooses_a_tier():
    """The tier modules (which of raw samples, seconds and rollups answers a window) are the
    store reader's private parts: outside the store's own modules nothing imports them; the
    dashboard reads windows through the reader."""
    from vramscope.agent.store.reader import TIER_MODULES

    assert all(m in MODULES for m in TIER_MODULES)
    store = under("vramscope.agent.store")
    wrong = {f"{m} -> {t}" for m, targets in GRAPH.items() for t in targets
             if t in TIER_MODULES and m not in store}
    assert sorted(wrong) == []
    assert "vramscope.agent.store.reader" in {
        t for m in under("vramscope.dashboard") for t in GRAPH[m]}


def _defined_names(path: Path) -> set[str]:
    """What a module defines at its top level: functions, classes and assigned names."""
    out: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return out


def _tier_names() -> set[str]:
    """The tier modules' public names (their private ones are private already)."""
    from vramscope.agent.store.reader import TIER_MODULES

    names = {n for m in TIER_MODULES for n in _defined_names(MODULES[m]) if n[0] != "_"}
    # the schema's rollup grid (ten-minute groups, the two-minute index): how a tier is laid
    # out, which only a tier module reads by
    return names | {"ROLLUP_TIER_S", "ROLLUP_GROUPS_S", "rollup_group"}


# The Store's methods that read one tier (downsampled buckets, the per-second tier's rows)
STORE_TIER_METHODS = frozenset({"timeline", "seconds", "seconds_phases", "seconds_columns"})


def tier_names_used(name: str, path: Path, banned: set[str]) -> set[str]:
    """The tier names ``name`` uses: imported (from any module: a re-export is the same name),
    or reached as an attribute (``reader.tier_grid``, ``store.timeline(...)``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom):
            out |= {f"{_resolve(name, path, node)}.{a.name}" for a in node.names
                    if a.name in banned}
        elif isinstance(node, ast.Attribute):
            owner = ast.unparse(node.value)
            if node.attr in banned or (node.attr in STORE_TIER_METHODS
                                       and owner.split(".")[-1] == "store"):
                out.add(f"{owner}.{node.attr}")
    return out


def test_no_tier_name_is_used_outside_the_store():
    """Which tier answers a window is chosen in the store alone: outside it no module uses a
    name the tier modules define (imported from wherever, the reader included, or reached as
    an attribute), nor calls the Store's one-tier reads (``store.timeline``,
    ``store.seconds``...): the reader's own calls are the way in."""
    banned = _tier_names()
    assert {"downsample", "tier_grid", "aligned_grid", "read_from", "count_at_most",
            "SECONDS_READ_MAX_S", "seconds_end", "raw_rows_over", "ROLLUP_TIER_S"} <= banned
    outside = set(MODULES) - under("vramscope.agent.store")
    wrong = {f"{m}: {used}" for m in outside
             for used in tier_names_used(m, MODULES[m], banned)}
    assert sorted(wrong) == []


def test_the_reader_s_calls_are_its_own():
    """A re-export cannot stand in for the reader: every function it offers is defined in it,
    and none of its names is a tier module's."""
    import inspect

    from vramscope.agent.store import reader

    offered = {n: getattr(reader, n) for n in reader.__all__}
    calls = {n for n, obj in offered.items() if inspect.isfunction(obj)}
    assert {"series", "records", "phase_bands", "requests", "timeline"} <= calls
    assert {n for n in calls if offered[n].__module__ != reader.__name__} == set()
    assert set(reader.__all__) & _tier_names() == set()


def test_the_tier_check_sees_a_re_export_and_an_attribute(tmp_path):
    path = tmp_path / "page.py"
    path.write_text("from vramscope.agent.store.reader import tier_grid as grid\n"
                    "from vramscope.agent.store import reader\n"
                    "def f(st):\n"
                    "    return reader.SECONDS_READ_MAX_S, st.store.timeline(0, 1, 2, 3, ())\n",
                    encoding="utf-8")
    assert tier_names_used("vramscope.dashboard.page", path, _tier_names()) == {
        "vramscope.agent.store.reader.tier_grid", "reader.SECONDS_READ_MAX_S",
        "st.store.timeline"}


@pytest.mark.parametrize("forbidden", ["vramscope.hooks", *VENDOR_ONLY_IN_SERVER])
def test_the_dashboard_never_reaches_the_hooks_torch_or_pynvml(forbidden):
    reached = reachable(under("vramscope.dashboard"), GRAPH)
    hits = sorted(m for m in reached if m == forbidden or m.startswith(forbidden + "."))
    assert hits == []


# What runs the alert engine over records: the offline driver (any of it) and the engine's
# evaluating classes. A constant of the engine's module (a timing the pages share) is not that.
# The [server] config check is the engine's too: the pages show the one it stored, never one
# made again with the dashboard's config (issue 46).
ENGINE_RUNNERS = {"vramscope.agent.alerts.offline": None,
                  "vramscope.agent.alerts.engine": frozenset({"AlertEngine"}),
                  "vramscope.agent.alerts.device": frozenset({"DeviceAnalysis"}),
                  "vramscope.agent.alerts.config_check": None}


def names_imported(name: str, path: Path) -> set[tuple[str, str]]:
    """``(module, name)`` of every ``from module import name`` in ``name`` (anywhere in it),
    and ``(module, "*")`` of every ``import module``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    out: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {(a.name, "*") for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(name, path, node)
            out |= {(module, a.name) for a in node.names}
    return out


def test_the_dashboard_runs_no_alert_engine():
    """Verdicts are made once, by the engine that sees every record (the agent, ``import``),
    and stored: no page runs the engine again (``/api/v1/analysis`` included)."""
    assert ("vramscope.agent.alerts.offline", "analyze_records") in names_imported(
        "vramscope.agent.cli.cmd_analyze", MODULES["vramscope.agent.cli.cmd_analyze"])
    reached = reachable(under("vramscope.dashboard"), RUNTIME_GRAPH)
    assert "vramscope.agent.alerts.offline" not in reached
    wrong = set()
    for m in under("vramscope.dashboard"):
        for module, what in names_imported(m, MODULES[m]):
            for runner, names in ENGINE_RUNNERS.items():
                if (module == runner or f"{module}.{what}" == runner) and (
                        names is None or what in names or what == "*"):
                    wrong.add(f"{m} -> {module}.{what}")
    assert sorted(wrong) == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root] & graph.keys())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child] & graph.keys()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles_other_than_alembics_env():
    cycles = [c for c in _cycles(RUNTIME_GRAPH) if not ALLOWED_CYCLE_MEMBERS & set(c)]
    assert cycles == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
