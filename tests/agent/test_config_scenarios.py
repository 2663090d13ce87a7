"""``tools/bench/config_scenarios.py``: prefill-spike OOMs warned from the [server] section
before the request arrives, and no config_oom where the worst request fits."""

from __future__ import annotations

import pytest
from vramscope.agent.alerts.engine import AlertEngine

from tools.bench import config_scenarios as cs

FLOOR_S = 60.0


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return cs.write_model(str(tmp_path_factory.mktemp("model")))


@pytest.mark.parametrize("index, oom", [(0, True), (1, True), (2, True), (3, True), (4, False),
                                        (5, False)])
def test_each_scenario_ooms_exactly_when_its_worst_request_cannot_fit(model, index, oom):
    sc = cs.SCENARIOS[index]
    out = cs.run_scenario(sc, FLOOR_S, model)
    assert out.oom is oom
    if oom:  # alerted at the first sample; the request at the end of the floor, OOM a second on
        assert (out.warned_ts, out.request_ts, out.oom_ts, out.lead_s) == (
            cs.START_S, cs.START_S + FLOOR_S, cs.START_S + FLOOR_S + 1, FLOOR_S + 1)
    else:
        assert out.warned_ts is None and out.oom_ts is None


def test_without_the_server_section_the_flat_floor_gives_no_warning(model):
    sc = cs.SCENARIOS[0]
    rec = cs.simulate(sc, FLOOR_S, cs.settings(sc, model))
    fired = [(c.rule, c.ts_s - cs.START_S) for c in AlertEngine.from_config(None).feed(
        [*rec.samples, *rec.events]) if c.kind == "fired"]
    assert fired == [("oom", FLOOR_S + 1), ("oom_risk", FLOOR_S + 1),
                     ("oom_risk_critical", FLOOR_S + 1)]  # at the OOM itself, not before


def test_figures(model):
    figs = cs.figures(quick=True)
    assert [(f.metric, f.value, f.unit, f.met) for f in figs] == [
        ("prefill-spike OOMs warned from the configuration before the request", 4.0, "of 4",
         True),
        ("min lead of the configuration warning before a prefill-spike OOM", 121.0, "s", None),
        ("config_oom on servers whose worst request fits", 0.0, "of 2", True)]
    assert figs[0].baseline == "without [server]: 1 of 4 warned before the request"
