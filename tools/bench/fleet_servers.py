"""The inference servers of ``bench fleet``'s simulated nodes, in one child process.

Each node is a real ``vramscope agent`` sampling its simulated devices itself (the NVML view);
what the agent hears from its servers comes from here: one :class:`SimServer` per device (the
demo's ``healthy`` server, its own workload seed), in real time, its per-process samples
(``torch`` allocator counters and ``kv`` pool counters) and its request events sent through
the node's socket by the hooks' own client, :class:`SocketSink` (one per node, as one
tensor-parallel server process spanning the node's GPUs would be one client). The servers'
own ``nvml`` samples are left out: the agent samples the device view, and two series of it
would collide.

Why a child process: the sending costs CPU in a process of its own, as real servers' hooks do,
not in the bench's, which times the dashboard at the end of the run.

Run as ``python -m tools.bench.fleet_servers DEVICES SEED SOCKET...``: it serves until
its stdin closes, then drains every client (a clean close: what is buffered is sent) and prints
one JSON line, per socket in the order given: records put, sent and dropped.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vramscope.agent.sim.server import SimServer
    from vramscope.hooks.client import SocketSink
    from vramscope.hooks.sink import Record

STEP_S = 0.25  # how often the servers are brought up to the wall clock
SAMPLE_INTERVAL_S = 1.0  # per-process samples at 1 Hz, as the devices are sampled
DRAIN_S = 30.0  # at the end: how long a client may take to send what it holds


class NodeSink:
    """A node's socket client, without the servers' own device view (the agent samples it)."""

    def __init__(self, socket_path: str, devices: int) -> None:
        from vramscope.hooks.client import SocketSink

        self.client: SocketSink = SocketSink(socket_path, process="fleet-sim-server",
                                             devices=tuple(range(devices)),
                                             model="sim-llama-3-8b", buffer_records=100_000)
        self.put_total = 0

    def put(self, record: Record) -> None:
        if getattr(record, "source", None) == "nvml":
            return
        self.put_total += 1
        self.client.put(record)

    def close(self) -> dict[str, Any]:
        deadline = time.monotonic() + DRAIN_S
        while self.client.buffered and time.monotonic() < deadline:
            time.sleep(0.05)
        self.client.close(timeout_s=5.0)
        return {"put": self.put_total, "sent": self.client.sent_total,
                "dropped": self.client.dropped_total}


def node_servers(sink: NodeSink, devices: int, seed: int, start_s: float) -> list[SimServer]:
    """One healthy server per device, each with its own traffic (seeded by node and device)."""
    from vramscope.agent.sim.scenarios import scenario_spec
    from vramscope.agent.sim.server import SimServer

    out = []
    for device in range(devices):
        spec = scenario_spec("healthy", device=device)
        n = seed * 1000 + device
        spec = replace(spec, seed=n, sample_interval_s=SAMPLE_INTERVAL_S,
                       workload=replace(spec.workload, seed=n))
        out.append(SimServer(spec, sink, start_s))  # type: ignore[arg-type]
    return out


def serve(sockets: list[str], devices: int, seed: int,
          stop: threading.Event) -> list[dict[str, Any]]:
    """Run every node's servers in real time until ``stop``; each node's counts after a drain."""
    start_s = time.time()
    sinks = [NodeSink(path, devices) for path in sockets]
    servers = [s for i, sink in enumerate(sinks)
               for s in node_servers(sink, devices, seed + i, start_s)]
    while not stop.wait(STEP_S):
        now_s = time.time()
        for server in servers:
            server.run_until(now_s)
    return [sink.close() for sink in sinks]


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("usage: python -m tools.bench.fleet_servers DEVICES SEED SOCKET...",
              file=sys.stderr)
        return 2
    devices, seed, sockets = int(argv[0]), int(argv[1]), argv[2:]
    stop = threading.Event()

    def wait_for_eof() -> None:
        sys.stdin.read()
        stop.set()
    threading.Thread(target=wait_for_eof, daemon=True).start()
    print(json.dumps(serve(sockets, devices, seed, stop)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
