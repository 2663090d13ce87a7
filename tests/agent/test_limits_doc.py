"""docs/agent.md, "Limits per client and per name", states each of issue 45's limits with its
default: the table's default column is built here from the code's own defaults (the settings
and the constants), so a changed default that the doc does not follow fails."""

from __future__ import annotations

from pathlib import Path

from vramscope.agent.ingest import protocol as proto
from vramscope.agent.ingest import server as ingest
from vramscope.agent.ingest.names import CLIENT_LIMITS, EVER_FACTOR
from vramscope.agent.settings import SETTINGS_BY_KEY

DOC = Path(__file__).resolve().parents[2] / "docs" / "agent.md"


def _default(key: str) -> float:
    return SETTINGS_BY_KEY[key].default


def _rows() -> list[list[str]]:
    text = DOC.read_text()
    section = text[text.index("## Limits per client and per name"):text.index("## Scrape bounds")]
    return [[c.strip() for c in line.strip("|").split("|")]
            for line in section.splitlines() if line.startswith("| ")]


def _row(setting: str) -> list[str]:
    found = [r for r in _rows() if setting in r[2]]
    assert len(found) == 1, f"{setting}: {len(found)} rows"
    return found


def _g(x: float) -> str:
    return f"{x:,g}" if x < 1e6 else f"{x:,.0f}"


def test_each_limit_s_default_is_the_code_s():
    mib = 2**20
    expect = {
        "`agent.max_hosts`": ", ".join(str(_default(f"agent.max_{k}"))
                                       for k in ("hosts", "devices", "processes")),
        "`agent.name_idle_s`": f"{_g(_default('agent.name_idle_s'))} s",
        "`CLIENT_LIMITS`": (f"{CLIENT_LIMITS.hosts} hosts, {CLIENT_LIMITS.devices} devices, "
                            f"{CLIENT_LIMITS.processes} processes"),
        "`EVER_FACTOR`": (f"{EVER_FACTOR} × the live bounds "
                          f"({EVER_FACTOR * _default('agent.max_hosts')}, "
                          f"{EVER_FACTOR * _default('agent.max_devices')})"),
        "`agent.client_max_rows_per_s`":
            f"{_g(_default('agent.client_max_rows_per_s'))} a second",
        "`agent.client_max_bytes_per_s`":
            f"{_g(_default('agent.client_max_bytes_per_s') / mib)} MiB a second",
        "`agent.client_budget_burst_s`":
            f"{_g(_default('agent.client_budget_burst_s'))} s of the rate",
        "`agent.client_max_rare_events_per_day`":
            f"{_g(_default('agent.client_max_rare_events_per_day'))} a day",
        "`agent.slot_idle_s`": f"{_g(_default('agent.slot_idle_s'))} s",
        "`MAX_CLIENTS`": str(ingest.MAX_CLIENTS),
        "`agent.handshake_timeout_s`": f"within {_g(_default('agent.handshake_timeout_s'))} s",
        "`agent.idle_timeout_s`": f"within {_g(_default('agent.idle_timeout_s'))} s",
        "`agent.max_message_bytes`": (f"{_g(_default('agent.max_message_bytes') / mib)} MiB, "
                                      f"{proto.MAX_RECORDS_PER_MESSAGE:,} records"),
        "`BUFFER_BUDGET_BYTES`": f"{ingest.BUFFER_BUDGET_BYTES // mib} MiB",
        "`agent.max_record_ahead_s`":
            f"`retention.raw_s` (a day), {_g(_default('agent.max_record_ahead_s'))} s",
        "`protocol.HEARTBEAT_MIN_GAP_S`": (f"{_g(proto.HEARTBEAT_MIN_GAP_S)} s (the hooks' client "
                                           f"sends one after {_g(proto.HEARTBEAT_S)} s without "
                                           "another message)"),
        "`alerts.webhook_max_per_alert_per_hour`": (
            f"{_default('alerts.webhook_max_per_alert_per_hour')} per alert an hour, "
            f"{_g(_default('alerts.webhook_queue_max'))} pending, a "
            f"{_g(_default('alerts.webhook_timeout_s'))} s timeout ([alerts](alerts.md#delivery))"),
    }
    assert _default("agent.max_record_age_s") == 0.0  # 0: retention.raw_s
    assert SETTINGS_BY_KEY["retention.raw_s"].default == 86400.0
    assert ingest.MAX_PENDING == 32
    wrong = {k: (v, _row(k)[0][1]) for k, v in expect.items() if _row(k)[0][1] != v}
    assert wrong == {}
