"""The event table (agent/event_kinds.py): every event name the code uses resolves in it, every
row has a class and a label, the sets the store, the alerts and the dashboard read by are the
table's, and a name it does not list is cheap, labelled, and never a KeyError."""

from __future__ import annotations

import ast
from pathlib import Path

import plotly.graph_objects as go
from vramscope.agent import event_kinds as ek
from vramscope.agent.alerts import saturation
from vramscope.agent.alerts.offline import OOM_CONTEXT
from vramscope.agent.analysis.diagnosis import KV_REFUSAL_EVENTS
from vramscope.agent.event_kinds import CHEAP, KEPT, Role
from vramscope.agent.store import reader
from vramscope.dashboard.figures import MARKER_DEFAULT, MARKER_STYLES, _marker_traces

ROOT = Path(__file__).resolve().parents[2]
# the installed package's folders; the bench (tooling, moving out of the package) is left out
SCANNED = ("agent", "dashboard", "hooks")
SKIPPED = ("agent/bench/",)
# the variables an event is held in where the code compares its name (``e.name == "oom"``,
# ``e["name"]`` in a timeline document); a trace's or a dialect's ``name`` is something else
EVENT_VARIABLES = frozenset({"e", "ev", "event", "r", "record"})
EVENT_CALLS = frozenset({"Event", "_event"})  # calls whose first string argument is a name


def _strings(node: ast.AST) -> list[str]:
    """The string constants of a literal: one, or a tuple / list / set of them (a ``+`` of
    such literals too, as in ``RARE_EVENTS + ("phase",)``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for elt in node.elts for s in _strings(elt)]
    if isinstance(node, ast.BinOp):
        return _strings(node.left) + _strings(node.right)
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("frozenset", "set",
                                                                           "tuple"):
        return [s for arg in node.args for s in _strings(arg)]
    return []


def _is_event_name(node: ast.AST) -> bool:
    """``e.name`` or ``e["name"]`` of an event variable."""
    if isinstance(node, ast.Attribute) and node.attr == "name":
        return isinstance(node.value, ast.Name) and node.value.id in EVENT_VARIABLES
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        key = node.slice
        return (node.value.id in EVENT_VARIABLES and isinstance(key, ast.Constant)
                and key.value == "name")
    return False


def _call_name(node: ast.Call) -> str | None:
    func = node.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)


def event_names_used(tree: ast.AST) -> set[str]:
    """Every event name a module spells out: emitted (``Event(ts, "oom", ...)``, a
    ``_event("kv_free", ...)``), compared (``e.name == "oom"``, ``e.name in (...)``), queried
    (``names=("oom", ...)``) or named as a constant (``LAYOUT_EVENT = "memory_layout"``,
    ``TIER_EVENTS = (...)``)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _call_name(node)
            if name == "Event" and len(node.args) > 1:
                found.update(_strings(node.args[1]))
            elif name in EVENT_CALLS:
                first = next((a for a in node.args if _strings(a)), None)
                found.update(_strings(first) if first is not None else [])
            elif name == "_new_event" and len(node.args) > 1:  # hooks/kv_source.py's tuples
                fields = node.args[1]
                if isinstance(fields, ast.Tuple) and len(fields.elts) > 1:
                    found.update(_strings(fields.elts[1]))
            for kw in node.keywords:
                if kw.arg == "names":
                    found.update(_strings(kw.value))
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_event_name(s) for s in sides):
                found.update(s for side in sides for s in _strings(side))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is not None and any(
                    isinstance(t, ast.Name) and t.id.endswith(("_EVENT", "_EVENTS"))
                    for t in targets):
                found.update(_strings(node.value))
    return found


def _scan() -> dict[str, set[str]]:
    """name -> the files that use it."""
    out: dict[str, set[str]] = {}
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(SKIPPED):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), rel)
            for name in event_names_used(tree):
                out.setdefault(name, set()).add(rel)
    return out


def test_every_event_name_the_code_uses_is_in_the_table():
    used = _scan()
    missing = {name: sorted(files) for name, files in used.items() if name not in ek.BY_NAME}
    assert missing == {}, ("event names used but not in agent/event_kinds.py's KINDS (add a "
                           "row: its class, label and roles): " + repr(missing))
    # the scan sees what it should: emitters in the hooks, the sim and the sources, the
    # comparisons of the analysis, the store's queries
    assert {"oom", "kv_alloc_failed", "kv_evicted", "snapshot", "memory_layout", "tokens",
            "process_exit", "process_rank", "nvml_process", "prefix_cache", "server_load",
            "kv_preempted", "kv_orphaned_blocks", "request_start", "phase"} <= set(used)
    assert "hooks/vllm_observer.py" in used["kv_evicted"]
    assert "agent/alerts/device.py" in used["kv_orphaned_blocks"]


def test_the_scanner_finds_each_kind_of_use():
    source = '''
LAYOUT_EVENT = "layout_x"
SOME_EVENTS: tuple[str, ...] = ("tuple_a", "tuple_b")
out.append(Event(ts, "emitted_y", 0))
self._event("hook_z", rid, {"reason": "not a name"})
if e.name == "compared_w" or e.name in ("in_v", "in_u"):
    pass
rows = store.events(0, names=OTHER + ("queried_t",))
if dialect.name == "postgresql" or t["name"] == "a trace":
    pass
'''
    assert event_names_used(ast.parse(source)) == {
        "layout_x", "tuple_a", "tuple_b", "emitted_y", "hook_z", "compared_w", "in_v", "in_u",
        "queried_t"}


def test_every_row_has_a_class_a_label_and_a_unique_name():
    assert len(ek.BY_NAME) == len(ek.KINDS)
    for kind in ek.KINDS:
        assert kind.keep in (CHEAP, KEPT), kind
        assert kind.label.strip() == kind.label and kind.label, kind
        assert 0 < len(kind.name) <= 64, kind  # the events table's name column
    markers = [k.label for k in ek.KINDS if Role.MARKER in k.roles]
    assert len(markers) == len(set(markers))  # one marker lane row each


def test_an_unknown_name_is_cheap_labelled_as_itself_and_read_by_nothing():
    kind = ek.kind_of("my_custom_event")
    assert kind == ek.EventKind("my_custom_event", CHEAP, "my_custom_event", Role.NONE)
    assert (ek.is_kept("my_custom_event"), ek.label_of("my_custom_event")) == \
        (False, "my_custom_event")
    assert (ek.is_kept("oom"), ek.label_of("oom")) == (True, "OOM")


def test_the_sets_read_by_are_the_tables():
    """The values each place had as its own list before the table, now derived from it."""
    assert ek.CHEAP_EVENTS == ("request_start", "request_end", "kv_alloc", "kv_free",
                               "kv_evicted", "phase", "nvml_process")
    assert reader.TIER_EVENTS == ("oom", "kv_orphaned_blocks")
    assert reader.RARE_EVENTS == ("oom", "kv_orphaned_blocks", "process_exit")
    assert reader.REQUEST_EVENTS == ("request_start", "request_end")
    assert reader.PHASE_EVENTS == ("phase",)
    assert set(reader.LOAD_EVENTS) == {"server_load", "kv_preempted", "tokens"}
    assert reader.PREFIX_EVENTS == ("kv_alloc", "prefix_cache")
    assert {"server_load", "kv_preempted"} == saturation.EVENTS
    assert {"kv_alloc_failed", "kv_preempted", "preemption"} == KV_REFUSAL_EVENTS
    assert {"oom", "request_start", "request_end", *KV_REFUSAL_EVENTS} == OOM_CONTEXT


def test_a_marker_event_without_a_style_is_drawn_with_the_default(monkeypatch):
    """A row given the marker role and no style yet is drawn, not a KeyError; a name the
    table does not list is no marker."""
    rows = (*ek.KINDS, ek.EventKind("gpu_reset", KEPT, "GPU reset", Role.MARKER))
    monkeypatch.setattr(ek, "BY_NAME", {k.name: k for k in rows})
    doc = {"events": [{"ts": 1.0, "name": "gpu_reset", "request_id": None, "message": "xid 79"},
                      {"ts": 2.0, "name": "oom", "request_id": None, "message": None},
                      {"ts": 3.0, "name": "not_listed", "request_id": None, "message": None}]}
    traces = {t["name"]: t for t in _marker_traces(doc)}
    assert sorted(traces) == ["GPU reset", "OOM"]
    assert (traces["GPU reset"]["marker"]["symbol"], traces["GPU reset"]["text"]) == \
        (MARKER_DEFAULT[0], ["xid 79"])
    assert traces["OOM"]["marker"]["symbol"] == MARKER_STYLES["OOM"][0]
    go.Figure({"data": list(traces.values())})
