"""``vramscope bench fleet --quick`` on a real PostgreSQL: every record sent is stored, per node.

The quick sizes (3 nodes of 2 simulated devices for 40 s, after one node alone) run as the
benchmark runs them: real ``vramscope agent`` processes, the simulated servers' child process,
one fresh database on the server, dropped after. Each node's count is exact: the records its
servers put into their client were all sent, and all are in the store under that host; every
row its agent says it wrote is stored; nothing was dropped on the way.
"""

from __future__ import annotations

import pytest
from vramscope.agent.cli import main

from tools.bench import BenchOptions
from tools.bench.fleet import Size, figures, run_fleet, sizes

QUICK = sizes(BenchOptions(quick=True))


@pytest.mark.postgres
def test_quick_fleet_stores_every_record_of_every_node(postgres_url):
    server, name = postgres_url.rsplit("/", 1)
    one = run_fleet(server, f"{name}_one", Size(1, QUICK.devices, QUICK.duration_s,
                                                QUICK.settle_s, QUICK.poll_s))
    many = run_fleet(server, f"{name}_many", QUICK)

    assert (QUICK.nodes, QUICK.devices) == (3, 2)
    assert list(one.counts) == ["node-00"]
    assert list(many.counts) == ["node-00", "node-01", "node-02"]
    for run in (one, many):
        for host, n in run.counts.items():
            assert n["put"] > 0, host  # the servers sent per-process samples and requests
            # every record put was sent, arrived and is stored under its host, once
            assert n["sent"] == n["put"] == n["stored_from_servers"], (host, n)
            assert n["agent_written"] == n["stored"], (host, n)  # the agent's own samples too
            assert (n["client_dropped"], n["agent_dropped"]) == (0, 0), (host, n)
            # the agent sampled each device at 1 Hz through the run: the rest are its samples
            device_samples = (n["stored"] - n["stored_from_servers"]) / QUICK.devices
            assert QUICK.duration_s <= device_samples <= QUICK.duration_s + 30, (host, n)
        assert set(run.lost.values()) == {0}
        assert run.rows == sum(n["stored"] for n in run.counts.values())
        assert run.leaders and set(run.leaders) == {1}  # one agent does the store-wide work
        assert run.leader in range(run.size.nodes)
        assert len(run.cpu) == len(run.rss) == run.size.nodes

    by_metric = {f.metric: f for f in figures([one], [many])}
    lost = by_metric["records lost, 3 nodes x 2 devices, 40 s"]
    assert (lost.value, lost.met) == (0, True)
    leaders = by_metric["agents leading the store-wide work, per poll"]
    assert (leaders.value, leaders.met) == (1, True)
    # the dashboard answered every page of the fleet at the end of the run
    assert {page for page, (_timing, status) in many.routes.items() if status == 200} == {
        "fleet page", "Overview", "/api/v1/overview", "device page", "/metrics"}
    assert many.route_urls["Overview"] == ["/", "/api/v1/overview?figures=true"]  # 6 devices


def test_fleet_without_a_postgresql_server_is_skipped_saying_what_it_needs(tmp_path, capsys):
    import json

    for db in ([], ["--db", str(tmp_path / "x.db")]):
        capsys.readouterr()
        assert main(["bench", "fleet", "--quick", "--json", *db]) == 0
        [skipped] = json.loads(capsys.readouterr().out)["skipped"]
        assert skipped["bench"] == "fleet"
        assert "bench fleet needs a PostgreSQL server" in skipped["error"]
        assert ("no --db" if not db else "a 'sqlite' URL") in skipped["error"]


def test_fleet_sizes_default_to_the_issues_fleet_and_take_the_options():
    options = BenchOptions(extra={"nodes": 16, "devices": 8, "duration_s": 600.0})
    assert sizes(options) == Size(16, 8, 600.0, 150.0, 30.0)
    assert sizes(BenchOptions()) == Size(64, 8, 1800.0, 150.0, 30.0)
    from vramscope.agent.errors import VramscopeError

    with pytest.raises(VramscopeError, match="at least 1 node of 1 device"):
        sizes(BenchOptions(extra={"nodes": 0}))


def test_fleet_pages_are_compared_with_one_nodes_own_even_where_the_overview_differs():
    from tools.bench import Timing
    from tools.bench.fleet import RunResult, pages

    def run(nodes: int, ms: float) -> RunResult:
        hosts = [f"node-{i:02d}" for i in range(nodes)]
        result = RunResult(Size(nodes, 8, 270.0, 135.0, 30.0), lost={h: 0 for h in hosts},
                           counts={h: {"sent": 10, "agent_written": 20, "stored": 20}
                                   for h in hosts},
                           cpu=[0.01] * nodes, rss=[60_000_000] * nodes, rows=20 * nodes,
                           growth_bytes=2**20 * nodes, record_s=270.0, leaders=[1])
        result.route_urls = pages(hosts, 8)
        result.routes = {page: (Timing([ms / 1000] * 3), 200) for page in result.route_urls}
        return result

    one, many = run(1, 10.0), run(16, 40.0)
    one.leader, many.leader = 0, 3
    many.cpu[3] = 0.05  # the leader does the store-wide work of every device
    # 8 devices: one node's own Overview; 128: the fleet's, grouped by host
    assert one.route_urls["Overview"] == ["/", "/api/v1/overview?figures=true"]
    assert many.route_urls["Overview"] == ["/", "/api/v1/fleet",
                                           "/api/v1/alerts?active=true&limit=200"]
    by_metric = {f.metric: f for f in figures([one], [many])}
    overview = by_metric["Overview (/, /api/v1/fleet, /api/v1/alerts), end of the run"]
    assert overview.value == pytest.approx(40.0)
    assert overview.spread.endswith("; 4x one node's 10 ms (Overview (/, /api/v1/overview))")
    device = by_metric["device page (/timeline, /api/v1/figures/timeline), end of the run"]
    assert (device.value, device.target, device.met) == (pytest.approx(40.0), "<= 300", True)
    assert by_metric["/metrics, end of the run"].spread.endswith("; 4x one node's 10 ms")
    assert "fleet page (/fleet, /api/v1/fleet), end of the run" in by_metric
    cpu = by_metric["worst agent CPU"]
    assert (cpu.value, cpu.met) == (pytest.approx(5.0), False)
    assert cpu.spread == ("median 1 % (1x one node alone, 1 %), min 1 % over 16 agents, from "
                          "135 s to the end; the leader (store-wide work) 5 %, the others' "
                          "worst 1 %")
