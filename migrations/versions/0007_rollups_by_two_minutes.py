"""rollups grouped by two minutes: an index for windows of two to four days

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 07:30:00

``ix_rollups_device_tier2m`` (device_id, CAST(bucket_s / 120.0 AS INTEGER), metric, min_value,
max_value): what ``ix_rollups_device_tier`` (0004, ten-minute groups) does for a week, this
does for timelines whose buckets are two to five minutes (2,000 points over two to seven
days): SQLite groups a device's minute rollups along the index instead of sorting them (three
days: 47k rollup rows, 121 ms of sorting and grouping). About 1 MB per device-day on SQLite.

Plain CREATE INDEX on both backends (no table rebuild).
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_rollups_device_tier2m', 'rollups',
                    ['device_id', sa.text('CAST(bucket_s / 120.0 AS INTEGER)'), 'metric',
                     'min_value', 'max_value'])


def downgrade() -> None:
    op.drop_index('ix_rollups_device_tier2m', table_name='rollups')
