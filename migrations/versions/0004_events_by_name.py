"""events: an index on (device_id, name, ts_s), so rare events are found by name

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 04:40:00

The timeline looks up a window's OOMs, orphaned KV blocks and phase changes by name. On the
``(device_id, ts_s)`` index alone that reads every event of the window to find them: a week of a
busy server is 327k request events a device, 0.15 s, to find none. A plain CREATE INDEX on both
backends (no table rebuild); ``Store.events`` queries one name at a time so that it is used.
"""
from __future__ import annotations

from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_events_device_name_ts', 'events', ['device_id', 'name', 'ts_s'])


def downgrade() -> None:
    op.drop_index('ix_events_device_name_ts', table_name='events')
