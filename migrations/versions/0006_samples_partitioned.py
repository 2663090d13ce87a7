"""PostgreSQL: samples partitioned by day of ts_s, so retention drops a day instead of its rows

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03 09:00:00

On PostgreSQL ``samples`` becomes a table partitioned by range of ``ts_s``: one partition per
day of Unix time (``samples_pYYYYMMDD``, UTC) and a DEFAULT partition (``samples_default``)
for rows of a day without one, so a write never fails (``agent/store/partitions.py``).
Retention creates tomorrow's and the next day's partitions ahead of the writes and drops a day
once all of it is older than the raw samples' cutoff.

A partitioned table's primary key and unique constraints must include the partition key: the
primary key becomes (id, ts_s), the idempotency key (origin, seq, ts_s). A replayed row carries
the same ts_s, so it still conflicts. ``id`` keeps its sequence, widened to 64 bits (2^31 ids
last 310 days at 8 devices x 10 Hz).

The conversion copies every row, in the upgrade's one transaction: the old table is renamed,
the partitioned one created like it, with a partition for each day that has rows, the rows
copied, the old table dropped, and the keys and the index built on the copy (faster than
maintaining them row by row). It needs the table's size again in free disk while it runs.

SQLite: nothing (one table, ``id`` its rowid).
"""
from __future__ import annotations

from datetime import datetime, timezone

from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

# partitions.DAY_S and its names, spelled here: a migration must not change with the code
_DAY_S = 86_400


def upgrade() -> None:
    if op.get_bind().dialect.name != 'postgresql':
        return
    c = op.get_bind()
    op.execute('ALTER TABLE samples RENAME TO samples_0005')
    op.execute('CREATE TABLE samples (LIKE samples_0005 INCLUDING DEFAULTS) '
               'PARTITION BY RANGE (ts_s)')
    # the rebuild is the cheap moment to widen the id: 2^31 of them last 310 days at 8 x 10 Hz
    op.execute('ALTER TABLE samples ALTER COLUMN id TYPE BIGINT')
    op.execute('ALTER SEQUENCE samples_id_seq AS BIGINT')
    op.execute('CREATE TABLE samples_default PARTITION OF samples DEFAULT')
    days = c.exec_driver_sql(
        f'SELECT DISTINCT CAST(floor(ts_s / {_DAY_S}) AS BIGINT) FROM samples_0005').scalars()
    for day in sorted(int(d) for d in days):  # the default is empty: plain PARTITION OF
        name = f"samples_p{datetime.fromtimestamp(day * _DAY_S, timezone.utc):%Y%m%d}"
        op.execute(f'CREATE TABLE {name} PARTITION OF samples '
                   f'FOR VALUES FROM ({day * _DAY_S}) TO ({(day + 1) * _DAY_S})')
    _copy('samples_0005')
    op.execute('ALTER TABLE samples ADD CONSTRAINT pk_samples PRIMARY KEY (id, ts_s)')
    op.execute('ALTER TABLE samples ADD CONSTRAINT uq_samples_origin_seq_ts_s '
               'UNIQUE (origin, seq, ts_s)')
    _foreign_key_and_index()


def downgrade() -> None:
    if op.get_bind().dialect.name != 'postgresql':
        return
    op.execute('ALTER TABLE samples RENAME TO samples_0006')
    op.execute('CREATE TABLE samples (LIKE samples_0006 INCLUDING DEFAULTS)')
    op.execute('ALTER TABLE samples ALTER COLUMN id TYPE INTEGER')
    _copy('samples_0006')  # drops the partitions with their table
    op.execute('ALTER TABLE samples ADD CONSTRAINT pk_samples PRIMARY KEY (id)')
    op.execute('ALTER TABLE samples ADD CONSTRAINT uq_samples_origin_seq UNIQUE (origin, seq)')
    _foreign_key_and_index()


def _copy(old: str) -> None:
    """Every row of ``old`` into the new ``samples`` (LIKE made its columns in the same
    order), the id sequence handed over, and ``old`` dropped, which frees its constraints'
    and index's names for the new table."""
    op.execute(f'INSERT INTO samples SELECT * FROM {old}')
    op.execute('ALTER SEQUENCE samples_id_seq OWNED BY samples.id')
    op.execute(f'DROP TABLE {old}')


def _foreign_key_and_index() -> None:
    op.execute('ALTER TABLE samples ADD CONSTRAINT fk_samples_device_id_devices '
               'FOREIGN KEY (device_id) REFERENCES devices (id)')
    op.execute('CREATE INDEX ix_samples_device_ts ON samples (device_id, ts_s)')
