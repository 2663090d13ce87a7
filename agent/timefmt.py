"""Times for people: Unix seconds as ISO 8601 UTC, the one format of the CLI, logs and pages.

Stored and JSON times stay Unix seconds (``_s``, docs/architecture.md rule 5); only text shown to a
person goes through here, so "leak detected at 1796139189.231" becomes "2026-12-02T01:33:09.231Z".

``MIN_TS_S`` .. ``MAX_TS_S`` (1970 to the end of year 9999) are the times every store, page and
``datetime`` can represent: records outside them are refused where they enter (trace files, the
socket), and a time outside them that is already stored is shown, never raised on.
"""

from __future__ import annotations

import datetime as _dt
import math

MIN_TS_S = 0.0  # 1970-01-01T00:00:00Z
MAX_TS_S = 253_402_300_799.0  # 9999-12-31T23:59:59Z: datetime's last second


def representable(ts_s: float) -> bool:
    """True for a finite time from 1970 to the end of year 9999."""
    return MIN_TS_S <= ts_s <= MAX_TS_S  # NaN compares false


def iso_utc(ts_s: float | None, *, ms: bool = True) -> str:
    """``2026-12-02T01:33:09.231Z`` (``ms=False``: whole seconds); ``-`` for no time; a time
    before 1970 or after year 9999 (a bad row already stored) as ``year>9999 (1e+12 s)``:
    its first ten characters still say which way it is out of range."""
    if ts_s is None or not math.isfinite(ts_s):
        return "-"
    if not representable(ts_s):
        return f"{'year<1970' if ts_s < MIN_TS_S else 'year>9999'} ({ts_s:.6g} s)"
    t = _dt.datetime.fromtimestamp(ts_s, tz=_dt.timezone.utc)
    text = t.isoformat(timespec="milliseconds" if ms else "seconds")
    return text.replace("+00:00", "Z")


def duration(seconds: float) -> str:
    """A duration as every surface says it (``rules.format_value`` of an ``_s`` metric):
    ``14.1 s`` under 2 minutes, ``52.3 min`` under 2 hours, then ``5.2 h``."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"
