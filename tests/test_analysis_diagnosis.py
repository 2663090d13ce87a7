"""OOM triage: one literal case per cause, checked in the documented order."""

import pytest

from agent.analysis.diagnosis import REMEDIES, complete_postmortem, diagnose, diagnose_warning
from agent.records import Phase, PostMortem, Sample

G = 2**30
LIMIT = 80 * G


def pm(phase=Phase.DECODE, failed=G // 2, driver_free=G // 5, allocated=70 * G,
       reserved=70 * G + G // 10, largest=G // 10, frag=None, in_flight=1, ts=1000.0):
    return PostMortem(ts, 0, 1, phase, failed, driver_free, LIMIT, allocated, reserved, largest,
                      frag, tuple(f"r{i}" for i in range(in_flight)))


def served(n=20, start=40 * G, step=0, phase=Phase.DECODE):
    return [Sample(float(i), 0, phase, allocated_bytes=start + step * i, device_total_bytes=LIMIT)
            for i in range(n)]


CASES = [
    ("startup", pm(Phase.UNKNOWN, in_flight=0), []),
    # 2 GiB failed; 10 GiB cached free + 1 GiB driver free, but the largest block is 1 GiB
    ("fragmentation", pm(Phase.PREFILL, failed=2 * G, driver_free=G, allocated=50 * G,
                         reserved=60 * G, largest=G, in_flight=3), served()),
    # baseline rose from 40 to 59 GiB (24 % of the device) before a small failure
    ("growth", pm(), served(step=G)),
    # one long prompt: 12 GiB (15 % of the device) in prefill
    ("prefill_spike", pm(Phase.PREFILL, failed=12 * G), served()),
    ("batch", pm(in_flight=5), served()),
    ("unknown", pm(), served()),
]


@pytest.mark.parametrize("cause, postmortem, samples", CASES, ids=[c[0] for c in CASES])
def test_diagnose(cause, postmortem, samples):
    assert diagnose(postmortem, samples) == (cause, REMEDIES[cause])


def test_samples_after_the_oom_are_ignored():
    later = [Sample(2000.0 + i, 0, Phase.DECODE, allocated_bytes=(40 + i) * G) for i in range(20)]
    assert diagnose(pm(), served() + later)[0] == "unknown"


def test_diagnose_from_samples_alone():
    growth = served(step=G) + [Sample(30.0, 0, Phase.PREFILL, allocated_bytes=79 * G)]
    assert diagnose(None, growth, ts_s=30.0)[0] == "growth"
    assert diagnose(None, [Sample(1.0, 0, Phase.UNKNOWN, allocated_bytes=G)], ts_s=2.0)[0] == \
        "startup"


def test_every_cause_has_remedies_and_fragmentation_names_expandable_segments():
    assert all(REMEDIES[c] for c in ("startup", "growth", "fragmentation", "prefill_spike",
                                     "batch", "unknown"))
    assert any("expandable_segments" in r for r in REMEDIES["fragmentation"])
    assert any("chunked prefill" in r for r in REMEDIES["prefill_spike"])


@pytest.mark.parametrize("reasons, cause", [
    (("alloc_retries",), "fragmentation"), (("trend", "fragmentation"), "fragmentation"),
    (("trend",), "growth"), (("headroom",), "prefill_spike"), ((), "unknown"),
])
def test_diagnose_warning(reasons, cause):
    assert diagnose_warning(reasons)[0] == cause


def test_under_a_per_process_cap_the_driver_free_memory_is_not_available():
    # 2 GiB failed, 1 GiB cached free; the driver has 60 GiB free but the 80 GiB cap leaves
    # only 0.5 GiB above the reserved 79.5 GiB: not enough in total, so not fragmentation
    capped = pm(Phase.PREFILL, failed=2 * G, driver_free=60 * G, allocated=78 * G + G // 2,
                reserved=79 * G + G // 2, largest=G // 2)
    assert diagnose(capped, served())[0] == "prefill_spike"
    roomy = capped._replace(device_total_bytes=120 * G)
    assert diagnose(roomy, served())[0] == "fragmentation"


def test_complete_postmortem_fills_what_the_producer_left_empty():
    done = complete_postmortem(pm(Phase.UNKNOWN, in_flight=0))
    assert (done.cause, done.remedies) == ("startup", REMEDIES["startup"])
    kept = pm()._replace(cause="batch")
    assert complete_postmortem(kept, served()).remedies == REMEDIES["batch"]
    final = kept._replace(remedies=("mine",))
    assert complete_postmortem(final) is final
