"""the per-second tier: one packed row per device, minute and source

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 07:00:00

Raw samples are kept ``retention.raw_s`` (now a day by default); what outlives them at one
second's resolution is the ``seconds`` table (``agent/store/seconds.py``: each minute's seconds
as delta-encoded, zlib-compressed series of count, phase and min / max / last of every counter).
A rowid table on SQLite (unlike the rollups, 0003): WITHOUT ROWID keeps at most about 1 kB of a
row on its B-tree page and spills the rest of a 1-2 kB blob to overflow pages, 4.7 kB a row.

A store upgraded from 0004 has no seconds yet: retention then starts its watermark at the
first raw sample and rolls the kept raw history up again, a few minutes per step (the minute
rollups it rewrites come out the same), before any raw sample is deleted.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'seconds',
        sa.Column('device_id', sa.Integer(), nullable=False),
        sa.Column('minute_s', sa.Float(), nullable=False),
        sa.Column('source', sa.String(length=32), nullable=False),
        sa.Column('seconds', sa.Integer(), nullable=False),
        sa.Column('data', sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(['device_id'], ['devices.id'],
                                name=op.f('fk_seconds_device_id_devices')),
        sa.PrimaryKeyConstraint('device_id', 'minute_s', 'source', name=op.f('pk_seconds')),
    )


def downgrade() -> None:
    op.drop_table('seconds')
