"""The database schema, as SQLAlchemy Core tables. Alembic revisions in ``migrations/`` create it;
``tests/agent/test_migrations.py`` runs ``alembic check`` so the two never drift.

Bytes are BigInteger, times are float seconds of Unix time (``_s``); JSON documents are text.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    ColumnElement,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    literal_column,
)
from vramscope.agent.records import SAMPLE_COUNTER_FIELDS

# Names for constraints and indexes, so migrations are reproducible on SQLite (batch mode) and
# PostgreSQL alike (Alembic cookbook: "The Importance of Naming Constraints").
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

hosts = Table(
    "hosts", metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(255), nullable=False),
    Column("boot_id", String(64), nullable=True),
    Column("first_seen_s", Float, nullable=False),
    Column("last_seen_s", Float, nullable=False),
    UniqueConstraint("name", name="uq_hosts_name"),
)

devices = Table(
    "devices", metadata,
    Column("id", Integer, primary_key=True),
    Column("host_id", Integer, ForeignKey("hosts.id"), nullable=False),
    # The label a device is addressed by: NVML's physical index for a GPU, mig_index(parent,
    # slot) for a MIG slice (vramscope.agent.sources.nvml). Records join on uuid when they
    # carry one, on (host, device_index) only when they do not (old rows, traces, no NVML).
    Column("device_index", Integer, nullable=False),
    Column("uuid", String(80), nullable=True),  # the identity: NVML's "GPU-..." / "MIG-..."
    Column("name", String(255), nullable=True),
    Column("total_bytes", BigInteger, nullable=True),
    Column("parent_uuid", String(80), nullable=True),  # a MIG slice's GPU
    Column("physical_index", Integer, nullable=True),  # the GPU's NVML index (a slice's parent's)
    UniqueConstraint("host_id", "device_index", name="uq_devices_host_index"),
    # a unique index, not a constraint: SQLite adds it without rebuilding the table (a rebuild
    # would have to drop a table that samples reference)
    Index("uq_devices_host_uuid", "host_id", "uuid", unique=True),
)

processes = Table(
    "processes", metadata,
    Column("id", Integer, primary_key=True),
    Column("host_id", Integer, ForeignKey("hosts.id"), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("name", String(255), nullable=True),  # shown as text, never as HTML
    Column("model", String(255), nullable=True),
    Column("devices", String(255), nullable=True),  # comma-separated device indexes
    # Distributed rank (torch.distributed, or RANK / LOCAL_RANK / WORLD_SIZE from the launcher)
    Column("rank", Integer, nullable=True),
    Column("local_rank", Integer, nullable=True),
    Column("world_size", Integer, nullable=True),
    # The pid inside the process's own PID namespace (a container), when it differs from `pid`
    # (always the agent's view: SO_PEERCRED, NVML's process rows).
    Column("ns_pid", Integer, nullable=True),
    Column("first_seen_s", Float, nullable=False),
    Column("last_seen_s", Float, nullable=False),
    UniqueConstraint("host_id", "pid", name="uq_processes_host_pid"),
)

# On PostgreSQL a table partitioned by range of ts_s, a partition per day plus a DEFAULT one
# (migration 0006, agent/store/partitions.py), so retention drops a day instead of deleting its
# rows. A partitioned table's keys must include ts_s: there the primary key is (id, ts_s),
# which Alembic does not compare, and the (origin, seq) key below is (origin, seq, ts_s) — a
# replayed row carries its ts_s, so it still conflicts. SQLite keeps one table, id its rowid.
samples = Table(
    "samples", metadata,
    # 64-bit on PostgreSQL (0006): 8 devices at 10 Hz use up 2^31 ids in 310 days. SQLite's
    # INTEGER PRIMARY KEY is its 64-bit rowid already (a BIGINT column would not be the rowid).
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True),
    Column("device_id", Integer, ForeignKey("devices.id"), nullable=False),
    Column("ts_s", Float, nullable=False),
    Column("phase", String(16), nullable=False),
    Column("source", String(32), nullable=True),
    Column("pid", Integer, nullable=True),
    *(Column(name, BigInteger, nullable=True) for name in SAMPLE_COUNTER_FIELDS),
    # Idempotent writes from many agents: (origin, seq) is unique when set, so a batch replayed
    # after a reconnect inserts nothing twice. NULLs never conflict (single-host default).
    Column("origin", String(64), nullable=True),
    Column("seq", BigInteger, nullable=True),
    UniqueConstraint("origin", "seq", name="uq_samples_origin_seq").ddl_if(dialect="sqlite"),
    UniqueConstraint("origin", "seq", "ts_s", name="uq_samples_origin_seq_ts_s")
    .ddl_if(dialect="postgresql"),
    # Idempotent import (0012, agent/store/content_keys.py): an imported row's content digest,
    # unique with its time, so a file imported twice or files that overlap store no row twice.
    # NULL for the live agent's rows, which the partial index leaves out.
    Column("content_key", BigInteger, nullable=True),
    Index("ix_samples_device_ts", "device_id", "ts_s"),
    Index("uq_samples_ts_content_key", "ts_s", "content_key", unique=True,
          sqlite_where=literal_column("content_key IS NOT NULL"),
          postgresql_where=literal_column("content_key IS NOT NULL")),
    postgresql_partition_by="RANGE (ts_s)",
)

# The compact raw tier (0015, agent/store/sample_blocks.py): the raw samples of one device,
# source and pid over one closed ``BLOCK_S`` interval, moved out of ``samples`` by compaction
# (``retention.compact_after_s``) as one row of compressed columns (agent/store/block_codec.py):
# about 10 bytes a sample where a row of ``samples`` and its indexes cost about 120. More than
# one block may share a key where rows arrived after their interval was compacted. ``first_s``
# and ``last_s`` are the first and last sample's times, so a range query prunes by the index
# before it decodes anything.
def _blocks_table(name: str, *key: Column[Any]) -> Table:
    """A table of the compact raw tier: blocks of a device's rows over one interval, ``key``
    the columns that tell its blocks of one interval apart."""
    return Table(
        name, metadata,
        Column("id", Integer, primary_key=True),
        Column("device_id", Integer, ForeignKey("devices.id"), nullable=False),
        Column("block_s", Float, nullable=False),  # the interval's start, a multiple of BLOCK_S
        *key,
        Column("first_s", Float, nullable=False),
        Column("last_s", Float, nullable=False),
        Column("count", Integer, nullable=False),
        Column("keyed", Integer, nullable=False),  # rows with a content_key (imported), or 0
        Column("data", LargeBinary, nullable=False),
        Index(f"ix_{name}_device_block", "device_id", "block_s"),
        # import's duplicate check looks keyed blocks up by time alone (content keys are not
        # per device)
        Index(f"ix_{name}_block", "block_s"),
    )


sample_blocks = _blocks_table("sample_blocks", Column("source", String(32), nullable=True),
                              Column("pid", Integer, nullable=True))

# The compact raw tier's events (0016, agent/store/event_blocks.py): the frequent events (every
# name retention does not keep with the rollups: requests, phases, KV allocations) of one
# device and pid over one closed ``BLOCK_S`` interval, moved out of ``events`` by the same
# compaction as the samples, as one row of compressed columns (agent/store/block_codec.py).
event_blocks = _blocks_table("event_blocks", Column("pid", Integer, nullable=True))

events = Table(
    "events", metadata,
    Column("id", Integer, primary_key=True),
    Column("device_id", Integer, ForeignKey("devices.id"), nullable=False),
    Column("ts_s", Float, nullable=False),
    Column("name", String(64), nullable=False),
    Column("pid", Integer, nullable=True),
    Column("phase", String(16), nullable=True),
    Column("request_id", String(255), nullable=True),
    Column("data", Text, nullable=True),  # JSON object of the event's other keys
    Column("origin", String(64), nullable=True),
    Column("seq", BigInteger, nullable=True),
    UniqueConstraint("origin", "seq", name="uq_events_origin_seq"),
    Column("content_key", BigInteger, nullable=True),  # as samples's: idempotent import (0012)
    Index("ix_events_device_ts", "device_id", "ts_s"),
    Index("uq_events_ts_content_key", "ts_s", "content_key", unique=True,
          sqlite_where=literal_column("content_key IS NOT NULL"),
          postgresql_where=literal_column("content_key IS NOT NULL")),
    # rare events (OOMs, phase changes) by name without reading the requests around them (0004)
    Index("ix_events_device_name_ts", "device_id", "name", "ts_s"),
)

alerts = Table(
    "alerts", metadata,
    Column("id", Integer, primary_key=True),
    Column("device_id", Integer, ForeignKey("devices.id"), nullable=True),
    Column("rule", String(128), nullable=False),
    Column("severity", String(16), nullable=False),
    Column("fired_ts_s", Float, nullable=False),
    Column("resolved_ts_s", Float, nullable=True),
    Column("value", Float, nullable=True),
    Column("message", Text, nullable=True),
    Column("labels", Text, nullable=True),  # JSON object
    Index("ix_alerts_fired", "fired_ts_s"),
)

postmortems = Table(
    "postmortems", metadata,
    Column("id", Integer, primary_key=True),
    Column("device_id", Integer, ForeignKey("devices.id"), nullable=False),
    Column("ts_s", Float, nullable=False),
    Column("pid", Integer, nullable=True),
    Column("cause", String(32), nullable=True),
    Column("summary", Text, nullable=False),  # PostMortem.to_json()
    Column("snapshot_path", Text, nullable=True),
    Index("ix_postmortems_ts", "ts_s"),
)

# Per device, per minute, per source and metric: min, max, mean, last (agent retention).
rollups = Table(
    "rollups", metadata,
    Column("device_id", Integer, ForeignKey("devices.id"), primary_key=True),
    Column("bucket_s", Float, primary_key=True),
    Column("source", String(32), primary_key=True),
    Column("metric", String(48), primary_key=True),
    Column("min_value", BigInteger, nullable=False),
    Column("max_value", BigInteger, nullable=False),
    Column("mean_value", Float, nullable=False),
    Column("last_value", BigInteger, nullable=False),
    Column("count", Integer, nullable=False),
    sqlite_with_rowid=False,  # the primary key is the table: no second copy of the key (0003)
)

# Ten-minute groups of the rollups, per device, source and metric (0008): what the minute
# rollups of a group add up to, kept by retention as it rolls minutes up (and read by views of a
# few days or more: a week is 1,008 groups, not 10,080 minutes). ``last_value`` is the value of
# the group's newest minute that measured the metric (``last_s``), so that a bucket's last values
# are those of its newest minute, as when its minutes are read.
rollups_10m = Table(
    "rollups_10m", metadata,
    Column("device_id", Integer, ForeignKey("devices.id"), primary_key=True),
    Column("bucket_s", Float, primary_key=True),  # the group's start, a multiple of 600
    Column("source", String(32), primary_key=True),
    Column("metric", String(48), primary_key=True),
    Column("min_value", BigInteger, nullable=False),
    Column("max_value", BigInteger, nullable=False),
    Column("last_value", BigInteger, nullable=False),
    Column("last_s", Float, nullable=False),  # the start of the minute last_value is from
    sqlite_with_rowid=False,
)

# The per-second tier (agent/store/seconds.py): per device, minute and source, that minute's
# seconds packed in one blob (count, phase, and min / max / last of every counter per second).
# Kept ``retention.second_s`` (default 14 days) after raw samples are gone (0005).
seconds = Table(
    "seconds", metadata,
    Column("device_id", Integer, ForeignKey("devices.id"), primary_key=True),
    Column("minute_s", Float, primary_key=True),
    Column("source", String(32), primary_key=True),  # "" for samples without a source
    Column("seconds", Integer, nullable=False),  # seconds with samples in the minute (1-60)
    Column("data", LargeBinary, nullable=False),
    # a rowid table: a row's blob (1-2 kB) then stays on its B-tree page, where WITHOUT ROWID
    # keeps at most ~1 kB in place and spills the rest to overflow pages (4.7 kB a row)
)

# Per device, minute and name, how many of the frequent events the minute had (0009): made by
# retention as it rolls a minute up, and kept as long as the rollups, so that a week's views
# still show the request rate after the request events are gone.
event_counts = Table(
    "event_counts", metadata,
    Column("device_id", Integer, ForeignKey("devices.id"), primary_key=True),
    Column("minute_s", Float, primary_key=True),
    Column("name", String(64), primary_key=True),
    Column("count", Integer, nullable=False),
    sqlite_with_rowid=False,
)

# Two-minute groups of rollups, in index order (0007): a timeline of two to four days groups its
# minute rollups per device along this index instead of sorting them (SQLite; see
# agent/store/downsample). SQL text, the same in the index and the queries: SQLite uses an
# expression index only for the very expression (a bound parameter for 120 would not match).
# Ten-minute groups are a table of their own (``rollups_10m``, 0008), which replaced the index
# 0004 kept for them.
ROLLUP_TIER_S = 600.0  # the rollups_10m table's group
ROLLUP_GROUPS_S = (120.0, 600.0)  # the group widths kept (an index, a table), finest first


def rollup_group(width_s: float) -> ColumnElement[Any]:
    """``CAST(bucket_s / <width> AS INTEGER)``: the group expression of the two-minute index,
    spelled as the index spells it."""
    return literal_column(f"CAST(bucket_s / {width_s!r} AS INTEGER)", Integer)


Index("ix_rollups_device_tier2m", rollups.c.device_id, rollup_group(120.0), rollups.c.metric,
      rollups.c.min_value, rollups.c.max_value)

# The alert engine's answers per device and process (agent/alerts/verdicts.py, 0010): written
# when an answer changes and at a heartbeat, by the live agent, ``import`` and ``replay``; every
# page, /api/v1/analysis, /metrics, ``analyze --db`` and ``status`` read them (one answer). The
# row's document is the verdict's JSON (docs/analysis.md, "Verdicts"); the columns are what a
# query selects on. Kept as long as the rollups.
verdicts = Table(
    "verdicts", metadata,
    Column("id", Integer, primary_key=True),
    Column("device_id", Integer, ForeignKey("devices.id"), nullable=False),
    Column("pid", Integer, nullable=True),  # None: the device as a whole
    Column("ts_s", Float, nullable=False),
    Column("leak_state", String(24), nullable=False),
    Column("risk_level", String(16), nullable=False),
    Column("doc", Text, nullable=False),
    Index("ix_verdicts_device_pid_ts", "device_id", "pid", "ts_s"),
    Index("ix_verdicts_device_ts", "device_id", "ts_s"),
)

# The device's answer as the alert engine chose it once (agent/alerts/verdicts.py
# ``DeviceVerdict``, 0014): its risk level, which process leads the OOM-risk and the leak
# question (the one its alerts name) and its [server] config check, written when one of them
# changes and at the verdicts' heartbeat. Every page reads the lead from here instead of
# choosing one of the processes' verdicts again. Kept as long as the verdicts.
device_verdicts = Table(
    "device_verdicts", metadata,
    Column("id", Integer, primary_key=True),
    Column("device_id", Integer, ForeignKey("devices.id"), nullable=False),
    Column("ts_s", Float, nullable=False),
    Column("level", String(16), nullable=False),  # "" before the risk model's first point
    Column("risk_pid", Integer, nullable=True),  # None: the device as a whole
    Column("leak_pid", Integer, nullable=True),
    # the [server] section's check at the device's limit as the engine made it (JSON; null
    # where the agent has no [server] section): the OOM risk page shows this one
    Column("config_check", Text, nullable=True),
    Index("ix_device_verdicts_device_ts", "device_id", "ts_s"),
)

# The agent's own health, so the dashboard can show it (Sidecar issue).
agent_stats = Table(
    "agent_stats", metadata,
    Column("id", Integer, primary_key=True),
    Column("host_id", Integer, ForeignKey("hosts.id"), nullable=False),
    Column("ts_s", Float, nullable=False),
    Column("clients", Integer, nullable=False),
    Column("rows_per_s", Float, nullable=False),
    Column("queue_depth", Integer, nullable=False),
    Column("dropped_total", BigInteger, nullable=False),
    Column("rejected_total", BigInteger, nullable=False),
    Column("db_size_bytes", BigInteger, nullable=True),
    # retention catching up (0011): data time still to roll up, and the time that will take at
    # the rate so far; null when retention is not behind
    Column("retention_behind_s", Float, nullable=True),
    Column("retention_eta_s", Float, nullable=True),
    # ingest refusals by reason since the agent's start, a JSON object of counts summing to
    # rejected_total (0013; the reasons are an open set); null on older rows
    Column("rejected_by_reason", Text, nullable=True),
    Index("ix_agent_stats_host_ts", "host_id", "ts_s"),
)
