"""Stored verdict rows are parsed once (agent/store/verdicts.py, ``PARSED_ROWS``): a fleet's
second read of the same rows parses nothing, gives the same answers, and a caller that edits
the documents it was given does not change the next reader's."""

from __future__ import annotations

from vramscope.agent.store import Store
from vramscope.agent.store import verdicts as stored

from tests.support.fleet_store import scripted_verdict

T = 1_800_000_000.0


def _store(tmp_path):
    s = Store.open(f"sqlite:///{tmp_path / 'v.db'}", host_name="node-00")
    s.upsert_process(1000, T, name="vllm", model="llama", device_indexes=[0])
    s.upsert_process(1001, T, name="vllm", model="llama", device_indexes=[1])
    stored.write(s, [scripted_verdict(T, 0, "node-00", 1000, "critical", 240.0, False),
                     scripted_verdict(T, 1, "node-00", 1001, "ok", None, True)])
    return s


def test_a_second_read_parses_no_row_and_answers_the_same(tmp_path):
    s = _store(tmp_path)
    try:
        stored._verdict.cache_clear()
        first = stored.fleet_verdicts(s, T + 1)
        parsed = stored._verdict.cache_info()
        second = stored.fleet_verdicts(s, T + 1)
        again = stored._verdict.cache_info()
    finally:
        s.close()
    assert (parsed.misses, parsed.hits) == (2, 0)
    assert (again.misses, again.hits) == (2, 2)
    assert second == first
    assert [(key, [(d["pid"], d["risk"]["level"], d["risk"]["time_to_oom_s"], d["leak"]["state"])
                   for d in docs]) for key, docs in sorted(second.processes.items())] == [
        (("node-00", 0), [(1000, "critical", 240.0, "no_leak")]),
        (("node-00", 1), [(1001, "ok", None, "leak")])]


def test_a_reader_s_edits_stay_its_own(tmp_path):
    s = _store(tmp_path)
    try:
        first = stored.fleet_verdicts(s, T + 1)
        first.processes[("node-00", 0)][0]["risk"]["level"] = "edited"
        first.processes[("node-00", 0)][0]["risk"]["reasons"].append("edited")
        second = stored.fleet_verdicts(s, T + 1)
    finally:
        s.close()
    doc = second.processes[("node-00", 0)][0]
    assert (doc["risk"]["level"], doc["risk"]["reasons"]) == ("critical", [])


def test_a_damaged_row_is_no_answer_read_after_read():
    assert stored._verdict("{not json") is None
    assert stored._verdict("{not json") is None
    assert stored._verdict('{"format": "vramscope.verdict/1"}') is None
