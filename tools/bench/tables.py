"""Markdown tables of ``vramscope bench --json`` files, for ``docs/BENCHMARKS.md``.

The figures in the doc are rendered from the JSON files kept beside it (``docs/bench/``), never
typed by hand, and ``tests/agent/test_bench_smoke.py`` re-renders every table to check it still
matches. A table sits between markers that name its sources, each ``FILE=LABEL`` (the label
fills the ``where`` column; ``_`` in it stands for a space), or ``FILE#BENCH=LABEL`` for only
the figures of one benchmark of a file that holds several::

    <!-- bench-table bench/cpu.json#ingest=CPU bench/h200-run1.json#ingest=H200 -->
    | bench | metric | ...
    <!-- /bench-table -->

``python -m tools.bench.tables docs/BENCHMARKS.md`` rewrites every such table in place;
``python -m tools.bench.tables FILE=LABEL ...`` prints one table.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

HEADER = ("| bench | metric | value | unit | spread | target | met | where |\n"
          "|---|---|---|---|---|---|---|---|")
BLOCK = re.compile(
    r"(<!-- bench-table (?P<sources>[^>]*?) -->\n)(?P<body>.*?)(<!-- /bench-table -->)", re.S)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "**missed**", None: ""}[met]


def rows(doc: dict[str, Any], where: str, bench: str | None = None) -> list[str]:
    """One row per figure (and per skipped benchmark), only ``bench``'s when it is given."""
    if doc.get("format") != "vramscope.bench/1":
        raise ValueError(f"not a vramscope.bench/1 document (format {doc.get('format')!r})")
    out = [f"| {f['bench']} | {_cell(f['metric'])} | {f['value']:.4g} | {_cell(f['unit'])} | "
           f"{_cell(f['spread'])} | {_cell(f['target'])} | {_verdict(f['met'])} | {where} |"
           for f in doc["figures"] if bench in (None, f["bench"])]
    out += [f"| {s['bench']} | skipped: {_cell(s['error'])} |  |  |  |  |  | {where} |"
            for s in doc.get("skipped", []) if bench in (None, s["bench"])]
    return out


def table(sources: str, base: Path) -> str:
    """The table for a marker's ``FILE[#BENCH]=LABEL ...`` list, files relative to ``base``."""
    lines = [HEADER]
    for item in sources.split():
        source, sep, label = item.partition("=")
        if not sep or not label:
            raise ValueError(f"bench-table source {item!r}: expected FILE=LABEL")
        path, _, bench = source.partition("#")
        found = rows(json.loads((base / path).read_text()), label.replace("_", " "), bench or None)
        if not found:
            what = f"no figures of bench {bench!r}" if bench else "no figures"
            raise ValueError(f"bench-table source {item!r}: {path} has {what}")
        lines += found
    return "\n".join(lines) + "\n"


def render(markdown: str, base: Path) -> str:
    """``markdown`` with every bench-table block re-rendered from its sources."""
    return BLOCK.sub(lambda m: m.group(1) + table(m.group("sources"), base) + m.group(4),
                     markdown)


def main(argv: list[str]) -> int:
    if len(argv) == 1 and argv[0].endswith(".md"):
        doc = Path(argv[0])
        doc.write_text(render(doc.read_text(), doc.parent))
        return 0
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    sys.stdout.write(table(" ".join(argv), Path.cwd()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
