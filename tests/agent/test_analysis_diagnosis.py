"""OOM triage: one literal case per cause, checked in the documented order."""

import pytest
from vramscope.agent.analysis.diagnosis import (
    REMEDIES,
    complete_postmortem,
    diagnose,
)
from vramscope.agent.records import Phase, PostMortem, Sample

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


# The simulator's OOMs (agent/sim, seeds of agent/sim/scenarios.py), as literal figures: a
# 22,614 MiB limit (a 24 GB card less the CUDA context).
M = 2**20
SIM_LIMIT = 23712497664


def sim_pm(failed, cached_free, room, largest, ext, in_flight, phase=Phase.PREFILL):
    reserved = SIM_LIMIT - room
    return PostMortem(5000.0, 1, 1, phase, failed, room, SIM_LIMIT, reserved - cached_free,
                      reserved, largest, ext, tuple(f"r{i}" for i in range(in_flight)))


def sim_baseline(first_mib, last_mib):
    """An hour of decode samples: ten at ``first_mib`` of allocated memory, twenty rising
    evenly, ten at ``last_mib`` (the quarters the diagnosis compares)."""
    mib = [first_mib] * 10 + [first_mib + (last_mib - first_mib) * i // 21
                              for i in range(1, 21)] + [last_mib] * 10
    return [Sample(1400.0 + 90 * i, 1, Phase.DECODE, allocated_bytes=m * M,
                   device_total_bytes=SIM_LIMIT) for i, m in enumerate(mib)]


SIM_CASES = [
    # `leak`, 3.8 simulated hours in: 56 MiB failed with 171 MiB cached free and 36 MiB left
    # to reserve (0.9 % of the limit) in blocks of at most 22 MiB. Compacted, the device is
    # still full; the idle baseline rose 574 MiB in the last hour: growth, not fragmentation
    ("leak_oom", sim_pm(56 * M, 171 * M, 36 * M, 22 * M, 0.871714, 5),
     sim_baseline(21627, 22201), "growth"),
    # the same OOM without the rise: a full device with five requests in flight
    ("full_flat", sim_pm(56 * M, 171 * M, 36 * M, 22 * M, 0.871714, 5),
     sim_baseline(22201, 22201), "batch"),
    # `fragmentation`, 20 minutes in: 480 MiB failed with 1,089 MiB cached free and 128 MiB
    # left (5.4 % of the limit), the largest block 352 MiB
    ("frag_oom", sim_pm(480 * M, 1089 * M, 128 * M, 352 * M, 0.676914, 37),
     sim_baseline(21000, 21100), "fragmentation"),
    # its third OOM: 1 MiB failed (decode) with 2,625 MiB cached free in pieces
    ("frag_small", sim_pm(1 * M, 2625 * M, 0, 864 * M, 0.670819, 29, Phase.DECODE),
     sim_baseline(20000, 20000), "fragmentation"),
]


@pytest.mark.parametrize("name, postmortem, samples, cause", SIM_CASES,
                         ids=[c[0] for c in SIM_CASES])
def test_simulator_ooms(name, postmortem, samples, cause):
    assert diagnose(postmortem, samples)[0] == cause
