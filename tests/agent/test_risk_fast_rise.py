"""The OOM risk's fast route (agent/analysis/peak_rise.py; docs/analysis.md, OOM risk): a rise
of the peaks established on evidence that scales with it, on scripted peaks."""

from vramscope.agent.analysis.peak_rise import PeakRise
from vramscope.agent.analysis.risk_model import RiskModel
from vramscope.agent.analysis.thresholds import Thresholds
from vramscope.agent.records import Phase, Sample

LIMIT = 10_000
ONSET = 1200  # twenty minutes of flat peaks (2000 B and a 5-B sawtooth) before each rise


def _rises(alloc, seconds):
    """A reading a second through 15-s windows; (window closing time, the rise or None)."""
    rise, out = PeakRise(15.0), []
    for t in range(seconds):
        if rise.add(float(t), alloc(t)):
            rate = rise.update(LIMIT, alloc(t), 2.0, 1800.0)
            out.append((t, None if rate is None else (round(rate.slope, 3), rate.span_s)))
    return out


def _ramp(slope):
    return lambda t: 2000 + t % 5 if t < ONSET else 2000 + slope * (t - ONSET)


def _first(out):
    return next((t, r) for t, r in out if r is not None)


def test_a_steep_rise_is_established_in_about_a_minute_a_gentle_one_waits():
    # 8,000 B of room: a ramp of 40 B/s fills it in 200 s, 10 B/s in 800 s, 4 B/s in 2000 s.
    # The stretch must span a minute and half its time to the limit: 75 s of the steep one
    # (5 peaks of it), 270 s of the middle one; the gentle one only once it is 660 s old, and
    # then on a stretch reaching back into the flat peaks (its rate diluted, its interval wide)
    assert _first(_rises(_ramp(40), 1400)) == (1275, (39.581, 75.0))
    assert _first(_rises(_ramp(10), 2000)) == (1470, (9.985, 270.0))
    assert _first(_rises(_ramp(4), 3200)) == (1860, (3.158, 930.0))


def test_a_burst_no_higher_than_one_before_is_no_rise():
    # a burst at 600 s to 5000 B is a rise while it lasts (nothing before it went as high);
    # the same burst at 1500 s, to 4760 B, is a load the server has carried
    def bursts(t):
        if 600 <= t < 720:
            return 2000 + 25 * (t - 600)
        if 1500 <= t < 1620:
            return 2000 + 23 * (t - 1500)
        return 2000 + t % 5

    said = [t for t, r in _rises(bursts, 1800) if r is not None]
    assert said == [705, 720]


def test_a_rise_holds_while_it_rises_and_ends_once_it_flattens():
    # 40 B/s from 1200 s to 1320 s, then flat at 6800 B: established at 1275 s, held while
    # its recent half still rises, over a minute after the rise stopped
    def flattens(t):
        if t < ONSET:
            return 2000 + t % 5
        return 2000 + 40 * (t - ONSET) if t < 1320 else 6800 + t % 5

    said = [t for t, r in _rises(flattens, 1600) if r is not None]
    assert said == list(range(1275, 1380, 15))


def test_a_noisy_ramp_goes_ok_to_critical_once_and_never_back():
    # 20 B/s with a 300-B pseudo-random wander on every reading, over twenty flat minutes: the
    # model's level changes once, straight to critical (220 s to the limit, under 5 min), and
    # holds to the end; the peaks meet the limit at 1585 s, 235 s after
    m = RiskModel(Thresholds(leak_warmup_s=0.0))
    changes = []
    for t in range(1600):
        wander = (t * 7919) % 300
        alloc = 2000 + wander if t < ONSET else 2000 + 20 * (t - ONSET) + wander
        p = m.update(Sample(float(t), 0, Phase.DECODE, allocated_bytes=alloc,
                            device_total_bytes=LIMIT))
        if not changes or changes[-1][1] != p.level:
            changes.append((t, p.level, None if p.time_to_oom_s is None
                            else round(p.time_to_oom_s)))
    assert changes == [(0, "ok", None), (1350, "critical", 220)]
    assert "trend" in p.reasons
