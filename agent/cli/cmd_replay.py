"""``vramscope replay FILE --socket PATH [--speed X | --as-fast-as-possible] [--retime]``.

Sends a trace-format-v1 file through the agent's socket as a hook client would: to test alert
rules against a recorded incident, and as the load generator of tests and benchmarks. Records
keep their timestamps (and pids); ``--speed`` only paces the sending, and ``--retime`` shifts
every time so that the trace ends now, inside the live agent's time window (docs/agent.md,
"Replay"); without it the output says how many records the agent refused for their time.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from vramscope.agent.cli import progress

if TYPE_CHECKING:
    from vramscope.agent.clock import Clock
    from vramscope.agent.ingest.connection import AgentConnection
    from vramscope.agent.records import Event, Sample

BATCH_RECORDS = 500


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("replay", help="send a trace file through the agent's socket",
                       description="Replay a trace-format-v1 file into a running agent.")
    p.add_argument("file", help="trace file (JSON Lines, trace format v1)")
    p.add_argument("--socket", dest="socket_path", help="the agent's socket (default: "
                                                        "agent.socket_path)")
    p.add_argument("--config", help="config file")
    pace = p.add_mutually_exclusive_group()
    pace.add_argument("--speed", type=float, default=1.0, metavar="X",
                      help="replay X times faster than recorded (default 1)")
    pace.add_argument("--as-fast-as-possible", action="store_true",
                      help="send as fast as the socket takes it")
    p.add_argument("--retime", action="store_true",
                   help="shift the trace's times so that it ends now: the agent keeps an old "
                        "trace like fresh data (without it, records older than "
                        "agent.max_record_age_s are refused and counted)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vramscope.agent.clock import SYSTEM_CLOCK
    from vramscope.agent.config import load_config
    from vramscope.agent.errors import UsageError
    from vramscope.agent.timefmt import iso_utc
    from vramscope.agent.trace import read_trace

    if not args.as_fast_as_possible and not args.speed > 0:
        raise UsageError(f"--speed must be > 0, got {args.speed}")
    config = load_config(args.config).replace(agent__socket_path=args.socket_path)
    with progress.shown("replay", progress.BYTES, progress.file_sizes([args.file]),
                        verb="read") as reading:
        trace = read_trace(args.file, on_read=reading.advance)
    records: list[Sample | Event] = [*trace.samples, *trace.events]
    records.sort(key=lambda r: r.ts_s)
    if args.retime:
        records = retimed(records, SYSTEM_CLOCK.time_s())
    speed = None if args.as_fast_as_possible else args.speed
    path = config["agent.socket_path"]
    before = _refused(path)
    with progress.shown("replay", "records", len(records), verb="sent") as sending:
        sent = replay(records, path, speed=speed, on_sent=sending.advance)
    print(f"replayed {sent} records from {args.file}"
          + (f", re-timed to end at {iso_utc(records[-1].ts_s)}" if args.retime and records
             else ""))
    refused_by = _refused(path)
    refused_by.subtract(before)
    refused = refused_by["ts"]
    if refused:
        what = ("the trace is longer than the window" if args.retime else
                "replay with --retime to stamp the trace as ending now, or use `vramscope "
                "import` to keep its times")
        print(f"the agent refused {refused} records as outside its time window (older than "
              f"agent.max_record_age_s or ahead of its clock; counted as rejected 'ts'): {what}")
    over_budget = refused_by["budget_rows"] + refused_by["budget_bytes"]
    if over_budget:
        print(f"the agent refused {over_budget} records beyond a client's write budget "
              f"(agent.client_max_rows_per_s, agent.client_max_bytes_per_s): replay with "
              f"--speed, or raise them for the replay")
    return 0


def retimed(records: list[Sample | Event], end_s: float) -> list[Sample | Event]:
    """``records`` (in time order) shifted by one offset so that the last is at ``end_s``."""
    if not records:
        return records
    offset = end_s - records[-1].ts_s
    return [r._replace(ts_s=r.ts_s + offset) for r in records]


def _refused(socket_path: str) -> Counter[str]:
    """The agent's counts of refused records by reason, from its status (other clients'
    refusals meanwhile count too: an upper bound)."""
    from vramscope.agent.ingest.connection import AgentConnection

    with AgentConnection(socket_path) as conn:
        return Counter({k: int(v) for k, v in conn.status().get("rejected", {}).items()})


def replay(records: list[Sample | Event], socket_path: str, *, speed: float | None = None,
           batch_records: int = BATCH_RECORDS, clock: Clock | None = None,
           on_sent: Callable[[int], None] | None = None) -> int:
    """Send ``records`` (in order) to the agent; pace by their timestamps unless ``speed`` is
    None; ``on_sent`` is told how many each batch sent held. Returns the number sent."""
    from vramscope.agent.clock import SYSTEM_CLOCK
    from vramscope.agent.ingest.connection import AgentConnection

    clock = clock or SYSTEM_CLOCK
    devices = sorted({r.device for r in records})
    with AgentConnection(socket_path) as conn:
        conn.hello("vramscope-replay", devices)
        send = _sender(conn, on_sent)
        if speed is None:
            for i in range(0, len(records), batch_records):
                send(records[i:i + batch_records])
        else:
            _paced(send, records, speed, clock)
        conn.status()  # a round trip: the agent has read everything we sent
    return len(records)


def _sender(conn: AgentConnection, on_sent: Callable[[int], None] | None
            ) -> Callable[[list[Sample | Event]], None]:
    if on_sent is None:
        return conn.send_records

    def send(batch: list[Sample | Event]) -> None:
        conn.send_records(batch)
        on_sent(len(batch))

    return send


def _paced(send: Callable[[list[Sample | Event]], None], records: list[Sample | Event],
           speed: float, clock: Clock) -> None:
    if not records:
        return
    t0_trace, t0 = records[0].ts_s, clock.monotonic_s()
    i = 0
    while i < len(records):
        due = t0 + (records[i].ts_s - t0_trace) / speed
        clock.sleep(due - clock.monotonic_s())
        j = i
        now_trace = t0_trace + (clock.monotonic_s() - t0) * speed
        while j < len(records) and records[j].ts_s <= now_trace and j - i < BATCH_RECORDS:
            j += 1
        send(records[i:max(j, i + 1)])
        i = max(j, i + 1)
