"""Pure analysis over records (no I/O, no clock, no globals); see docs/analysis.md.

Modules: ``fragmentation``, ``phases``, ``leaks``, ``risk``, ``kv``, ``diagnosis``, ``report``
(the ``vramscope.analysis/1`` document), ``stats`` (Theil–Sen, Mann–Kendall).
"""
