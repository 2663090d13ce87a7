"""Times for people: Unix seconds as ISO 8601 UTC, the one format of the CLI, logs and pages.

Stored and JSON times stay Unix seconds (``_s``, docs/architecture.md rule 5); only text shown to a
person goes through here, so "leak detected at 1796139189.231" becomes "2026-12-02T01:33:09.231Z".
"""

from __future__ import annotations

import datetime as _dt
import math


def iso_utc(ts_s: float | None, *, ms: bool = True) -> str:
    """``2026-12-02T01:33:09.231Z`` (``ms=False``: whole seconds); ``-`` for no time."""
    if ts_s is None or not math.isfinite(ts_s):
        return "-"
    t = _dt.datetime.fromtimestamp(ts_s, tz=_dt.timezone.utc)
    text = t.isoformat(timespec="milliseconds" if ms else "seconds")
    return text.replace("+00:00", "Z")


def duration(seconds: float) -> str:
    """A duration as every surface says it (``rules.format_value`` of an ``_s`` metric):
    ``14.1 s`` under 2 minutes, ``52.3 min`` under 2 hours, then ``5.2 h``."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"
