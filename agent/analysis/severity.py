"""How bad: the one order of the risk model's levels and the alerts' severities.

A risk level (``ok``, ``warning``, ``critical``) and an alert's severity (``info``,
``warning``, ``critical``) are one scale. Its numbers are a contract: the ``risk_level`` rule
metric, the Prometheus ``vramscope_risk_level`` and ``vramscope_process_risk_level`` series and
the risk model's ``level_index`` all say 0 ok, 1 warning, 2 critical. An ``info`` alert tells
and does not raise a device's level, so it ranks as ``ok`` (a device whose only alert is an
``info`` one is ``ok``).

Stored verdicts carry a level as text, ``""`` (:data:`NO_LEVEL`) before the risk model's first
point: it ranks below ``ok`` (a process the model has judged leads one it has not). Any other
text is not a severity and is refused by name (:meth:`Severity.parse`), never ranked as a guess.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum


class Severity(IntEnum):
    OK = 0
    WARNING = 1
    CRITICAL = 2

    @property
    def label(self) -> str:
        """The name as records, config files and pages write it: ``"warning"``."""
        return self.name.lower()

    @classmethod
    def parse(cls, value: object, where: str = "severity") -> Severity:
        """The severity a level or an alert severity names; ``ValueError`` naming ``where`` and
        the value for anything else."""
        if isinstance(value, Severity):
            return value
        found = _BY_NAME.get(value) if isinstance(value, str) else None
        if found is None:
            raise ValueError(f"{where}: {value!r} is not a severity (one of "
                             f"{', '.join(_BY_NAME)})")
        return found


LEVELS = tuple(s.label for s in Severity)  # the risk model's levels, by their number
ALERT_SEVERITIES = ("info", "warning", "critical")  # what a rule's ``severity`` may say
NO_LEVEL = ""  # a stored verdict's level before the risk model's first point
_BY_NAME = {"ok": Severity.OK, "info": Severity.OK, "warning": Severity.WARNING,
            "critical": Severity.CRITICAL}


def rank(name: str, where: str = "severity") -> int:
    """The place of a level or alert severity on the scale, to sort by: -1 for
    :data:`NO_LEVEL`, else its :class:`Severity`'s number."""
    return -1 if name == NO_LEVEL else int(Severity.parse(name, where))


def worst(names: Iterable[str], where: str = "severity") -> Severity:
    """The highest severity among ``names`` (:data:`NO_LEVEL` skipped); ``OK`` when none."""
    return max((Severity.parse(n, where) for n in names if n != NO_LEVEL), default=Severity.OK)
