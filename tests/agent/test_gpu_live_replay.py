"""The live H100 run of issue 44 (docs/gpu-runs/2026-12-06/live/main, docs/gpu-verification.md
section 20) replayed through today's alert engine in one-second batches, as the agent's writer
feeds it, with the post-mortem completed the way the live agent stores it (AlertFeed.completed).
Section 21's stored rows are what the agent said during the run; these are what it says now:
the grower (pid 700, 124 MiB a second from its first kept tensor on, until a real
torch.OutOfMemoryError) named about 80 s after its onset with cause growth, and after its OOM:
the post-mortem's cause growth, no risk of the dead episode, and its leak alert resolved as
ended, not "no leak"."""

import json
import tarfile

import pytest
from vramscope.agent.alerts.engine import AlertEngine
from vramscope.agent.daemon import AlertFeed
from vramscope.agent.store import Store

from tests.support.gpu_replay import records, replay, unpacked
from tools.agent_process import REPO_ROOT

RUN = REPO_ROOT / "docs" / "gpu-runs" / "2026-12-06" / "live" / "main"
GROWER, RESTARTED = 700, 986


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("h100-live")
    db = unpacked(RUN / "growth_oom.db.gz", tmp)
    with tarfile.open(RUN / "growth_oom_files.tar.gz") as tar:
        grow = json.load(tar.extractfile("./cb-grow.json"))
    store = Store.open(f"sqlite:///{db}")
    # as the server sent them: the cause the live agent stored is taken off
    sent = sorted((p._replace(cause=None, remedies=()) for _, p in store.postmortems()),
                  key=lambda p: p.ts_s)
    store.close()
    feed = AlertFeed(AlertEngine.from_config(None), [], None)
    feed.engine.verdicts.keep = True
    stored = []

    def complete(last_ts: float) -> None:  # as the writer stores one after the batch before
        while sent and sent[0].ts_s <= last_ts:
            stored.append(feed.completed(sent.pop(0)))

    changes = replay(feed.engine, records(db, tmp), complete)
    return feed.engine, changes, stored, grow


def test_the_grower_is_named_80_s_after_its_onset_and_its_post_mortem_says_growth(replayed):
    engine, changes, stored, grow = replayed
    onset = grow["first_kept_ts"]
    seen = [(c.kind, c.rule, round(c.ts_s - onset, 1)) for c in changes]
    oom = next(t for kind, rule, t in seen if rule == "oom")
    assert seen == [("fired", "memory_leak", 80.9), ("fired", "oom_risk", 96.0),
                    ("fired", "oom_risk_critical", 300.0), ("resolved", "oom_risk", oom),
                    ("resolved", "oom_risk_critical", oom), ("fired", "oom", oom),
                    ("resolved", "memory_leak", 694.0)]
    assert oom == 614.5  # named 533.6 s (8.9 min) before the OOM, forecast then 9.0 min
    fired = [c for c in changes if c.kind == "fired"]
    assert f"full in about 9.0 min (7.8 min to 10.6 min) [pid {GROWER}]" in fired[0].message
    assert all("; likely growth;" in c.message for c in fired[1:3])
    # after the OOM: no risk of the dead episode (the floor under its spikes is read anew),
    # and its leak alert resolves once the process is gone, saying so
    assert changes[-1].message == ("idle floor rising after the warm-up (pid 700 ended; its "
                                   "last answer: leak)")
    assert [(p.pid, p.cause) for p in stored] == [(GROWER, "growth")]
    after = [v for v in engine.verdicts.history
             if v.pid == GROWER and v.ts_s - grow["first_kept_ts"] >= oom]
    assert {(v.leak_state, v.risk_level) for v in after} == {("leak", "ok")}
    assert after[-1].ended


def test_the_restarted_neighbour_is_never_a_leak(replayed):
    engine, *_ = replayed
    rows = [v for v in engine.verdicts.history if v.pid == RESTARTED]
    assert rows and {v.leak_state for v in rows} == {"insufficient_data"}
