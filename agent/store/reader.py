"""The store's one reader of windows: every question a page, the API or ``analyze --db`` asks of a
span of one device (its host, start and end), and the only module outside the store's
internals that knows which tier answers it.

The tiers (raw samples, the per-second tier, minute and ten-minute rollups) and the choice among
them live in the modules behind this one, which nothing outside ``vramscope.agent.store``
imports (``tests/test_import_graph.py`` checks it): ``downsample`` (series on a grid of
buckets, min / max / last, the tier chosen by the bucket width and what retention kept),
``window`` (bounded counts and reads: "at most N" asked before anything is built),
``event_rate`` (requests per minute from the event rollups or the raw events),
``phase_shares`` (phase changes and per-bucket phase counts) and ``process_series`` (each
process's allocated / reserved bytes where raw samples keep its pid, and which processes the
pid-less tiers mix elsewhere). A caller asks for a resolution (a number of buckets, a limit);
the answer says which tier gave it only where the page prints it (``read_from``, and
``ProcessWindow.unread`` where per-process series could not be read).
"""

from __future__ import annotations

from vramscope.agent.store.downsample import (
    SECONDS_READ_MAX_S,
    aligned_grid,
    device_row_id,
    downsample,
    raw_rows_over,
    read_from,
    seconds_end,
    tier_grid,
)
from vramscope.agent.store.event_rate import request_rate
from vramscope.agent.store.phase_shares import phase_changes, phase_counts
from vramscope.agent.store.process_series import (
    PROCESS_COLUMNS,
    PROCESS_RAW_LIMIT,
    UNREAD_LIMIT,
    UNREAD_TIERS,
    ProcessWindow,
    process_window,
)
from vramscope.agent.store.window import (
    count_at_most,
    events_at_most,
    first_sample_ts,
    seconds_at_most,
)

# the modules behind the reader: imported by the store's own modules and by this one only
TIER_MODULES = ("vramscope.agent.store.downsample", "vramscope.agent.store.window",
                "vramscope.agent.store.event_rate", "vramscope.agent.store.phase_shares",
                "vramscope.agent.store.process_series")

__all__ = ["PROCESS_COLUMNS", "PROCESS_RAW_LIMIT", "SECONDS_READ_MAX_S", "TIER_MODULES",
           "UNREAD_LIMIT", "UNREAD_TIERS", "ProcessWindow", "aligned_grid", "count_at_most",
           "device_row_id", "downsample", "events_at_most", "first_sample_ts", "phase_changes",
           "phase_counts", "process_window", "raw_rows_over", "read_from", "request_rate",
           "seconds_at_most", "seconds_end", "tier_grid"]
