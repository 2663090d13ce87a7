"""``vramscope replay FILE --socket PATH [--speed X | --as-fast-as-possible]``.

Sends a trace-format-v1 file through the agent's socket as a hook client would: to test alert
rules against a recorded incident, and as the load generator of tests and benchmarks. Records
keep their timestamps (and pids, when the trace has them); ``--speed`` only paces the sending.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vramscope.agent.config import load_config
    from vramscope.agent.errors import UsageError
    from vramscope.agent.trace import read_trace

    if not args.as_fast_as_possible and not args.speed > 0:
        raise UsageError(f"--speed must be > 0, got {args.speed}")
    config = load_config(args.config).replace(agent__socket_path=args.socket_path)
    trace = read_trace(args.file)
    records: list[Sample | Event] = [*trace.samples, *trace.events]
    records.sort(key=lambda r: r.ts_s)
    speed = None if args.as_fast_as_possible else args.speed
    sent = replay(records, config["agent.socket_path"], speed=speed)
    print(f"replayed {sent} records from {args.file}")
    return 0


def replay(records: list[Sample | Event], socket_path: str, *, speed: float | None = None,
           batch_records: int = BATCH_RECORDS, clock: Clock | None = None) -> int:
    """Send ``records`` (in order) to the agent; pace by their timestamps unless ``speed`` is
    None. Returns the number sent."""
    from vramscope.agent.clock import SYSTEM_CLOCK
    from vramscope.agent.ingest.connection import AgentConnection

    clock = clock or SYSTEM_CLOCK
    devices = sorted({r.device for r in records})
    with AgentConnection(socket_path) as conn:
        conn.hello("vramscope-replay", devices)
        if speed is None:
            for i in range(0, len(records), batch_records):
                conn.send_records(records[i:i + batch_records])
        else:
            _paced(conn, records, speed, clock)
        conn.status()  # a round trip: the agent has read everything we sent
    return len(records)


def _paced(conn: AgentConnection, records: list[Sample | Event], speed: float,
           clock: Clock) -> None:
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
        conn.send_records(records[i:max(j, i + 1)])
        i = max(j, i + 1)
