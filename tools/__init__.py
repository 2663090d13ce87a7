"""Tooling of the source checkout, never installed: the wheel (``pyproject.toml``'s packages)
holds the product only, and ``tests/test_packaging.py`` checks that nothing of this tree is in it.

``bench`` (``vramscope bench``: the benchmarks and the labelled recordings they score),
``sim`` (simulator parts only the benchmarks and the GPU check use), ``history_generator`` (a
store of days of history, for benchmarks and tests), ``agent_process`` (a real ``vramscope
agent`` child process, for tests and benchmarks), ``config_docs`` (renders
docs/configuration.md) and ``screenshots`` (the dashboard's pages as PNG files).

Run from the repository root (``python -m tools.bench.tables docs/BENCHMARKS.md``), or through
``vramscope bench``, which finds this tree beside the package's folders of an editable install.
Imports go one way: tools import the product (``vramscope.*``), the product never imports tools
(``tests/test_import_graph.py``).
"""
