"""ten-minute rollup groups: a table of their own instead of an index

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 14:00:00

``rollups_10m`` holds, per device, ten minutes, source and metric, what the minute rollups of
the group add up to: the least minimum, the greatest maximum, and the last value of its newest
minute (``last_s``). Retention keeps it as it rolls minutes up (``maintenance.
refresh_ten_minutes``). Views of a few days or more read it instead of the minutes: a week is
1,008 groups of a device, not 10,080 minutes that SQLite grouped along
``ix_rollups_device_tier`` (0004; 120k index entries, 150-170 ms of a 7-day analysis), and
PostgreSQL hashed. That index is dropped (about 1 MB per device-day on SQLite; the table is a
tenth of the rollups).

Backfilled here from the rollups a store already has, in SQL that both backends run: the groups'
extremes and newest minute grouped, then each group's last value by primary key.
WITHOUT ROWID on SQLite, as the rollups (0003).
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

_GROUP = "CAST(bucket_s / 600.0 AS INTEGER)"


def upgrade() -> None:
    op.create_table(
        'rollups_10m',
        sa.Column('device_id', sa.Integer(), nullable=False),
        sa.Column('bucket_s', sa.Float(), nullable=False),
        sa.Column('source', sa.String(length=32), nullable=False),
        sa.Column('metric', sa.String(length=48), nullable=False),
        sa.Column('min_value', sa.BigInteger(), nullable=False),
        sa.Column('max_value', sa.BigInteger(), nullable=False),
        sa.Column('last_value', sa.BigInteger(), nullable=False),
        sa.Column('last_s', sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(['device_id'], ['devices.id'],
                                name=op.f('fk_rollups_10m_device_id_devices')),
        sa.PrimaryKeyConstraint('device_id', 'bucket_s', 'source', 'metric',
                                name=op.f('pk_rollups_10m')),
        sqlite_with_rowid=False,
    )
    # the groups' extremes and newest minute; last_value a placeholder until the next statement
    # (PostgreSQL: floor() of a float division is what SQLite's CAST gives for times after 1970)
    group = (_GROUP if op.get_bind().dialect.name == "sqlite"
             else "CAST(floor(bucket_s / 600.0) AS INTEGER)")
    op.execute(f"INSERT INTO rollups_10m (device_id, bucket_s, source, metric, min_value, "
               f"max_value, last_value, last_s) SELECT device_id, {group} * 600.0, source, "
               f"metric, min(min_value), max(max_value), 0, max(bucket_s) FROM rollups "
               f"GROUP BY device_id, {group}, source, metric")
    op.execute("UPDATE rollups_10m SET last_value = (SELECT r.last_value FROM rollups r "
               "WHERE r.device_id = rollups_10m.device_id AND r.bucket_s = rollups_10m.last_s "
               "AND r.source = rollups_10m.source AND r.metric = rollups_10m.metric)")
    op.drop_index('ix_rollups_device_tier', table_name='rollups')


def downgrade() -> None:
    op.create_index('ix_rollups_device_tier', 'rollups',
                    ['device_id', sa.text(f'{_GROUP}'), 'metric', 'min_value', 'max_value'])
    op.drop_table('rollups_10m')
