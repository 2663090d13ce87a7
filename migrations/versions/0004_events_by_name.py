"""events found by name, rollups grouped by ten minutes: two indexes for week-long windows

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 04:40:00

``ix_events_device_name_ts`` (device_id, name, ts_s): the timeline looks up a window's OOMs,
orphaned KV blocks and phase changes by name. On the ``(device_id, ts_s)`` index alone that
reads every event of the window to find them: a week of a busy server is 327k request events a
device, 0.15 s, to find none. ``Store.events`` queries one name at a time so that it is used.

``ix_rollups_device_tier`` (device_id, CAST(bucket_s / 600.0 AS INTEGER), metric, min_value,
max_value): a week's timeline groups a device's 130k minute rollups by ten-minute group and
metric in this index's order, instead of sorting them (SQLite; ``agent/store/downsample.py``).
About 50 bytes a rollup row on SQLite (0.9 MB per device-day at 13 metrics).

Plain CREATE INDEX on both backends (no table rebuild).
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_events_device_name_ts', 'events', ['device_id', 'name', 'ts_s'])
    op.create_index('ix_rollups_device_tier', 'rollups',
                    ['device_id', sa.text('CAST(bucket_s / 600.0 AS INTEGER)'), 'metric',
                     'min_value', 'max_value'])


def downgrade() -> None:
    op.drop_index('ix_rollups_device_tier', table_name='rollups')
    op.drop_index('ix_events_device_name_ts', table_name='events')
