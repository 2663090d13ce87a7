"""A fleet on one PostgreSQL: several agents, different hosts, a server restart in the middle.

Real parts only: a PostgreSQL server of our own (the session's shared one cannot be
restarted), three ``vramscope agent`` processes with simulated devices (``--fake-devices``,
the seam in ``vramscope.agent.sources.nvml``) and distinct host names
(``VRAMSCOPE_AGENT_HOST_NAME``),
each also receiving a known series of hook records through its socket from a real
``SocketSink``. Midway the server goes away for a while and comes back. Afterwards:

- every host and its devices are there, apart (device 0 of each host is its own row);
- every hook record sent is stored exactly once (its ``allocated_bytes`` is its number);
- no NVML sample is stored twice nor missing (sampling went on through the outage; the
  bounded queue held the records until the database was back, and they were written while
  the agent ran, not only in its final flush);
- each agent stored exactly as many rows as it says it committed, and dropped none.

And the case a restart rarely hits but a fleet eventually does: a commit that succeeded but
whose reply was lost. The writer retries the batch; its ``(origin, seq)`` keys make the retry
insert nothing twice.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from vramscope.agent.records import Phase, Sample
from vramscope.agent.store import Store

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ("gpu-node-a", "gpu-node-b", "gpu-node-c")
DEVICES = 2
BURST = 100  # hook records per agent in each of three bursts: before, during, after the outage
OUTAGE_S = 1.5
AGENT_CONFIG = """
[sampling]
device_interval_s = 0.02
process_interval_s = 3600

[agent]
batch_interval_s = 0.05
"""
STOPPED = re.compile(r"agent stopped: (\d+) rows written, (\d+) dropped")


@pytest.fixture(scope="module")
def own_postgres():
    from tests.support.pgserver import PostgresServer

    try:
        server = PostgresServer()
    except RuntimeError as exc:
        pytest.fail(str(exc))  # the postgres marker promises a server; say why there is none
    server.start()
    yield server
    server.destroy()


class AgentProcess:
    def __init__(self, tmp: Path, host: str, url: str) -> None:
        self.host = host
        home = tmp / host
        home.mkdir()
        (home / "vramscope.toml").write_text(AGENT_CONFIG)
        self.socket_path = str(home / "run" / "agent.sock")
        env = {**os.environ, "VRAMSCOPE_AGENT_HOST_NAME": host, "XDG_RUNTIME_DIR": str(home),
               "XDG_DATA_HOME": str(home), "PYTHONPATH": str(ROOT)}
        env.pop("VRAMSCOPE_CONFIG", None)
        self.stderr_path = home / "agent.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vramscope", "agent", "--config", str(home / "vramscope.toml"),
             "--db", url, "--socket", self.socket_path, "--fake-devices", str(DEVICES)],
            env=env, cwd=home, stdout=subprocess.DEVNULL, stderr=self.stderr_path.open("w"))

    def log(self) -> str:
        return self.stderr_path.read_text()

    def wait_listening(self, deadline: float) -> None:
        while not os.path.exists(self.socket_path):
            if self.proc.poll() is not None:
                pytest.fail(f"agent {self.host} exited {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                pytest.fail(f"agent {self.host} did not listen in time:\n{self.log()}")
            time.sleep(0.05)

    def stop(self) -> tuple[int, int]:
        """SIGTERM (final flush), then (rows written, rows dropped) from its last log line."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"agent {self.host} did not stop on SIGTERM:\n{self.log()}")
        found = STOPPED.findall(self.log())
        assert found, f"agent {self.host} did not report its totals:\n{self.log()}"
        return int(found[-1][0]), int(found[-1][1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def hook_samples(burst: int) -> list[Sample]:
    """Known records: number n has allocated_bytes = n and its own timestamp."""
    t0 = time.time()
    return [Sample(t0 + i * 1e-4, 0, Phase.DECODE, "torch", os.getpid(), allocated_bytes=n,
                   reserved_bytes=2 * n)
            for i, n in enumerate(range(burst * BURST, (burst + 1) * BURST))]


def send_burst(sinks: list, burst: int) -> None:
    for sink in sinks:
        for record in hook_samples(burst):
            sink.put(record)


def wait_sent(sinks: list, total: int, deadline: float) -> None:
    while any(s.sent_total < total for s in sinks):
        if time.monotonic() > deadline:
            pytest.fail(f"hook records not sent: {[s.sent_total for s in sinks]} of {total}")
        time.sleep(0.05)


def wait_caught_up(url: str, back_s: float, deadline: float) -> None:
    """Until every host has all its hook records and NVML samples from after the outage."""
    with Store.open(url, upgrade=False) as store:
        while True:
            done = [_caught_up(store, host, back_s) for host in HOSTS]
            if all(done):
                return
            if time.monotonic() > deadline:
                pytest.fail(f"agents did not catch up after the restart: {done}")
            time.sleep(0.1)


def _caught_up(store: Store, host: str, back_s: float) -> bool:
    samples = store.samples(host=host)
    hooks = sum(1 for s in samples if s.source == "torch")
    return hooks == 3 * BURST and any(s.ts_s > back_s for s in samples if s.source == "nvml")


def test_agents_of_a_fleet_write_every_row_once_across_a_server_restart(tmp_path, own_postgres):
    from vramscope.agent.cli import main
    from vramscope.hooks.client import SocketSink

    url = own_postgres.create_database("fleet")
    # The documented fleet set-up: create the schema once, then start the agents. (Agents
    # started at once on an empty database race in Alembic's CREATE TABLE: reported.)
    assert main(["db", "upgrade", "--db", url]) == 0
    agents = [AgentProcess(tmp_path, host, url) for host in HOSTS]
    sinks = []
    try:
        deadline = time.monotonic() + 60
        for agent in agents:
            agent.wait_listening(deadline)
        sinks = [SocketSink(a.socket_path, process="fleet-test") for a in agents]
        send_burst(sinks, 0)
        wait_sent(sinks, BURST, deadline)
        time.sleep(1.0)  # committed, with NVML samples, before the outage

        own_postgres.stop()
        send_burst(sinks, 1)  # the agents take these while the database is gone
        wait_sent(sinks, 2 * BURST, deadline)
        time.sleep(OUTAGE_S)
        own_postgres.start()
        back_s = time.time()

        send_burst(sinks, 2)
        wait_sent(sinks, 3 * BURST, deadline)
        wait_caught_up(url, back_s, deadline)  # while running, not in the final flush
        for sink in sinks:
            sink.close()
        assert [s.dropped_total for s in sinks] == [0] * len(sinks)
        totals = {a.host: a.stop() for a in agents}
    finally:
        for sink in sinks:
            sink.close(0.1)
        for agent in agents:
            agent.kill()

    logs = {a.host: a.log() for a in agents}
    with Store.open(url, upgrade=False) as store:
        check_hosts_and_devices(store)
        for host in HOSTS:
            check_host_rows(store, host, totals[host], logs[host])


def check_hosts_and_devices(store: Store) -> None:
    assert [h["name"] for h in store.hosts()] == list(HOSTS)
    devices = store.devices(host="*")
    assert [(d["host"], d["device_index"]) for d in devices] == [
        (h, i) for h in HOSTS for i in range(DEVICES)]
    assert len({d["id"] for d in devices}) == len(HOSTS) * DEVICES
    assert [d["uuid"] for d in devices] == [f"GPU-fake-{i:04d}" for _ in HOSTS
                                            for i in range(DEVICES)]


def check_host_rows(store: Store, host: str, written_dropped: tuple[int, int],
                    log: str) -> None:
    written, dropped = written_dropped
    samples = store.samples(host=host)
    hooks = sorted(s.allocated_bytes for s in samples if s.source == "torch")
    assert hooks == list(range(3 * BURST)), f"{host}: hook records not stored exactly once"
    nvml = Counter((s.device, s.ts_s) for s in samples if s.source == "nvml")
    assert nvml and max(nvml.values()) == 1, f"{host}: an NVML sample stored twice"
    assert {d for d, _ in nvml} == set(range(DEVICES))
    for device in range(DEVICES):  # sampling went on through the outage: no hole in the series
        ts = sorted(t for d, t in nvml if d == device)
        gap_s = max(b - a for a, b in zip(ts, ts[1:]))
        assert gap_s < 1.0, f"{host} device {device}: {gap_s:.2f} s without samples"
    events = store.events(host=host)
    assert (dropped, len(samples) + len(events)) == (0, written), f"{host}:\n{log}"
    assert "cannot write to the database" in log  # it did see the outage...
    assert "database writable again" in log  # ...and came back



class AckLostStore:
    """The real store, except that the first ``write`` commits and then reports the
    connection lost — what a client sees when the server dies between COMMIT and its reply."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.lost = 0

    def write(self, *args, **kwargs) -> int:
        inserted = self._store.write(*args, **kwargs)
        if self.lost == 0:
            from sqlalchemy.exc import OperationalError
            from vramscope.agent.errors import StoreError

            self.lost += 1
            cause = OperationalError("COMMIT", {}, Exception("server closed the connection"))
            raise StoreError("cannot write: server closed the connection") from cause
        return inserted

    def __getattr__(self, name):
        return getattr(self._store, name)


def test_a_batch_retried_after_a_lost_commit_reply_is_stored_once(postgres_url):
    """The writer retries a batch whose commit reply was lost; (origin, seq) makes the
    retry insert nothing twice."""
    from vramscope.agent.writer import Writer

    with Store.open(postgres_url, host_name="gpu-node-a") as real:
        store = AckLostStore(real)
        writer = Writer(store, batch_rows=50)
        for n in range(120):
            writer.put(Sample(1_700_000_000.0 + n, n % 2, source="torch", allocated_bytes=n))
        writer.flush()  # stops at the failed commit, which stays pending...
        writer.flush()  # ...and is retried here
        assert writer.queue_depth == 0
        assert store.lost == 1 and writer.stats.failed_attempts == 1
        values = sorted(s.allocated_bytes for s in real.samples(host="gpu-node-a"))
        assert values == list(range(120))
        assert writer.stats.written_total == 120
