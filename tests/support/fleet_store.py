"""A fleet's store: 64 hosts of 8 GPUs, each host an hour of the project's generated history
(:mod:`tools.history_generator`, one sample per 5 s), with verdicts scripted
as an alert engine would have stored them: every process ``ok`` and ``no_leak`` at each
heartbeat, except

- three critical devices with known times to OOM (``CRITICAL``), two of them on one host;
- a warning with a time to OOM, and one without (``WARNING``);
- a leak (``LEAK``), risk still ok;
- a host whose agent went away half an hour before the end (``GONE``): its devices' newest
  samples, and verdicts, are 30 minutes old: stale;
- a process that ended on a critical device of its own (``ENDED``): its last answer is
  critical, and no page may show it;
- a device whose server reported a queue and preempted requests (``SATURATED``: its
  ``server_load`` and ``kv_preempted`` events) for ``/metrics``' KV saturation.

Each host's agent reported at its end (``report_of``: dropped records and queue depth).

Half the hosts are H100s, half H200s (``MODELS``), so the model filter splits the fleet.
``NOW_S`` is a second after the newest sample. Building it takes seconds on SQLite.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramscope.agent.alerts.verdicts import Verdict
from vramscope.agent.records import Event
from vramscope.agent.store import Store
from vramscope.agent.store import verdicts as stored

from tools.history_generator import GIB, MIB, T_END, History, generate

HOSTS = 64
DEVICES = 8
NOW_S = T_END + 1.0
HEARTBEAT_S = 300.0
GONE = "node-50"
GONE_END_S = T_END - 1800.0
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
# (host, device) -> time to OOM at the newest verdict
CRITICAL = {("node-41", 5): 600.0, ("node-07", 6): 240.0, ("node-07", 2): 1800.0}
WARNING = {("node-12", 0): 5400.0, ("node-20", 3): None}
LEAK = ("node-33", 4)
LEAK_SLOPE_BYTES_PER_S = 8 * MIB / 3600.0  # 8 MiB an hour
ENDED = ("node-02", 1)  # pid 9001 there ended critical; the device's own process is ok
SATURATED = ("node-41", 5)
# (waiting, running) of its newest server_load event, and the requests preempted 20 s ago
SATURATED_LOAD, SATURATED_PREEMPTED = (6, 3), 2


def host_name(i: int) -> str:
    return f"node-{i:02d}"


def model_of(host: str) -> str:
    return H100 if int(host.split("-")[1]) % 2 == 0 else H200


def pid_of(device: int) -> int:
    return 1000 + device  # the generator's pid per device


@dataclass(frozen=True)
class FleetStore:
    url: str
    store: Store


def build(url: str, hosts: int = HOSTS, first: int = 0) -> FleetStore:
    """The fleet's store at ``url``: its hosts ``first`` to ``hosts - 1`` (a smaller fleet
    keeps the scripted devices of those hosts; ``first``: a fleet built up to it grows)."""
    for i in range(first, hosts):
        name = host_name(i)
        s = Store.open(url, host_name=name)
        try:
            end = GONE_END_S if name == GONE else T_END
            generate(s, History(devices=DEVICES, hz=0.2, days=1 / 24, end_s=end, events=False,
                                rollups=False, verdicts=False))
            for d in range(DEVICES):
                s.describe_device(d, uuid=f"GPU-{i:02d}{d:02d}", name=model_of(name),
                                  total_bytes=80 * GIB if model_of(name) == H100 else 141 * GIB)
                s.upsert_process(pid_of(d), end, name="vllm", model="llama", device_indexes=[d])
            stored.write(s, _verdicts(name, end))
            dropped, queue = report_of(name)
            s.write_agent_stats(end, clients=DEVICES, rows_per_s=1.6, queue_depth=queue,
                                dropped_total=dropped, rejected_total=0, db_size_bytes=None)
            if name == SATURATED[0]:
                s.write([], _saturation_events(SATURATED[1]))
        finally:
            s.close()
    return FleetStore(url, Store.open(url, host_name=host_name(0)))


def report_of(host: str) -> tuple[int, int]:
    """The host's agent report: (records dropped, queue depth), its number and a tenth of it."""
    i = int(host.split("-")[1])
    return i, i // 10


def _saturation_events(device: int) -> list[Event]:
    """An older load than the newest (the newest counts), and a preemption within the last
    minute."""
    pid = pid_of(device)
    waiting, running = SATURATED_LOAD
    return [Event(T_END - 300.0, "server_load", device, pid, data={"waiting": 1, "running": 1}),
            Event(T_END - 30.0, "server_load", device, pid,
                  data={"waiting": waiting, "running": running}),
            Event(T_END - 20.0, "kv_preempted", device, pid,
                  data={"count": SATURATED_PREEMPTED})]


def _verdicts(host: str, end: float) -> list[Verdict]:
    rows = []
    beats = [end - 3600.0 + k * HEARTBEAT_S for k in range(int(3600 // HEARTBEAT_S) + 1)]
    for ts in beats:
        last = ts == beats[-1]
        for d in range(DEVICES):
            level, tto = "ok", None
            if last and (host, d) in CRITICAL:
                level, tto = "critical", CRITICAL[(host, d)]
            elif last and (host, d) in WARNING:
                level, tto = "warning", WARNING[(host, d)]
            leaking = (host, d) == LEAK and ts >= beats[2]
            rows.append(scripted_verdict(ts, d, host, pid_of(d), level, tto, leaking))
        if (host, ENDED[1]) == ENDED and ts < beats[-1]:
            ended = ts == beats[-2]
            rows.append(scripted_verdict(ts, ENDED[1], host, 9001, "critical", 60.0, False)
                        ._replace(ended=ended))
    return rows


def scripted_verdict(ts: float, device: int, host: str, pid: int, level: str, tto: float | None,
             leaking: bool) -> Verdict:
    return Verdict(ts, device, host, pid, "leak" if leaking else "no_leak",
                   LEAK_SLOPE_BYTES_PER_S if leaking else 0.0, ts - 1200 if leaking else None,
                   ts - 600 if leaking else None, 3000.0, "scripted", level,
                   "kv_cache" if level != "ok" else None, (), 4 * GIB,
                   tto, None if tto is None else tto / 2, None if tto is None else tto * 2,
                   None, None)
