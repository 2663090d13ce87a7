"""One name for each shared duration (agent/durations.py): no other module of the package
defines the rollups' minute, the per-second tier's second, an hour or a day again under a name
of its own, so the tiers that must agree on a minute cannot drift apart."""

from __future__ import annotations

import ast
from pathlib import Path

from vramscope.agent import durations

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("agent", "dashboard", "hooks")
# the names these durations had, one or more per module, before they had one
SHARED_NAMES = frozenset({"SECOND_S", "MINUTE_S", "HOUR_S", "DAY_S", "BUCKET_S", "ROLLUP_S",
                          "ROLLUP_BUCKET_S", "ONE_MINUTE", "MINUTE"})


def _defined(tree: ast.Module) -> list[tuple[str, ast.expr]]:
    """The module-level constants a module assigns: (name, value)."""
    out = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and node.value is not None:
            out += [(t.id, node.value) for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and node.value is not None \
                and isinstance(node.target, ast.Name):
            out.append((node.target.id, node.value))
    return out


def test_the_shared_durations_are_defined_once():
    again = []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "agent/durations.py":
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), rel)
            for name, value in _defined(tree):
                if name not in SHARED_NAMES:
                    continue
                again.append(f"{rel}: {name} = {ast.unparse(value)}")
    assert again == [], "import it from vramscope.agent.durations instead: " + repr(again)


def test_the_values():
    assert (durations.SECOND_S, durations.MINUTE_S, durations.HOUR_S, durations.DAY_S) == \
        (1.0, 60.0, 3600.0, 86400.0)


def test_the_scan_sees_a_definition():
    tree = ast.parse("MINUTE_S = 60.0\nBUCKET_S: float = 60.0\nOTHER = 1\n")
    assert [name for name, _ in _defined(tree)] == ["MINUTE_S", "BUCKET_S", "OTHER"]
