"""The durations several modules mean the same thing by, one name each.

The rollups' minute is the same minute in retention (what it rolls up at a time), the per-second
tier (a row holds a minute's seconds), the event counts, the downsampling that reads them and
the history generator that writes them: one constant, so that they cannot drift apart. A
duration that only one module decides (a grace, a window, a timeout) stays with that module,
whatever its value. ``tests/agent/test_durations.py`` checks that no other module defines these
names again.
"""

from __future__ import annotations

SECOND_S = 1.0  # the per-second tier's bucket
MINUTE_S = 60.0  # the rollups' bucket, the per-second tier's row, the event counts' minute
HOUR_S = 3_600.0
DAY_S = 86_400.0  # a UTC day: PostgreSQL's day partitions, the per-client cap of kept events
