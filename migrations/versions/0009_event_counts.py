"""per-minute counts of the frequent events

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 21:00:00

``event_counts`` holds, per device, minute and name, how many requests started and ended, KV
blocks moved and phases changed (the events retention deletes after ``retention.raw_s``).
Retention makes a minute's counts as it rolls the minute up and keeps them as long as the
rollups, so a view of a week still shows the request rate. Backfilled here from the events a
store still has (their minutes, grouped in SQL that both backends run). WITHOUT ROWID on SQLite,
as the rollups (0003).
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

# frozen here: a migration must not follow the live schema module
_NAMES = "('request_start', 'request_end', 'kv_alloc', 'kv_free', 'phase')"


def upgrade() -> None:
    op.create_table(
        'event_counts',
        sa.Column('device_id', sa.Integer(), nullable=False),
        sa.Column('minute_s', sa.Float(), nullable=False),
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('count', sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(['device_id'], ['devices.id'],
                                name=op.f('fk_event_counts_device_id_devices')),
        sa.PrimaryKeyConstraint('device_id', 'minute_s', 'name', name=op.f('pk_event_counts')),
        sqlite_with_rowid=False,
    )
    # PostgreSQL: floor() of a float division is what SQLite's CAST gives for times after 1970
    minute = ("CAST(ts_s / 60.0 AS INTEGER)" if op.get_bind().dialect.name == "sqlite"
              else "CAST(floor(ts_s / 60.0) AS INTEGER)")
    op.execute(f"INSERT INTO event_counts (device_id, minute_s, name, count) "
               f"SELECT device_id, {minute} * 60.0, name, count(*) FROM events "
               f"WHERE name IN {_NAMES} GROUP BY device_id, {minute}, name")


def downgrade() -> None:
    op.drop_table('event_counts')
