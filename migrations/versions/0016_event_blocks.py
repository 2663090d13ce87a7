"""the compact raw tier's events: closed intervals of frequent events as blocks of compressed
columns

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07 10:30:00

``event_blocks`` holds, per device, pid and ten-minute interval, the interval's frequent events
(every name retention does not keep with the rollups) as compressed columns
(agent/store/event_blocks.py). As with 0015, the migration only adds the table: an existing
store's events move into blocks through compaction, which the agent holding the store-wide
lock runs after the upgrade, one interval per transaction, oldest first; it can stop at any
point and reads stay exact. Downgrading drops the table and the events it holds.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'event_blocks',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('device_id', sa.Integer(), nullable=False),
        sa.Column('block_s', sa.Float(), nullable=False),
        sa.Column('pid', sa.Integer(), nullable=True),
        sa.Column('first_s', sa.Float(), nullable=False),
        sa.Column('last_s', sa.Float(), nullable=False),
        sa.Column('count', sa.Integer(), nullable=False),
        sa.Column('keyed', sa.Integer(), nullable=False),
        sa.Column('data', sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(['device_id'], ['devices.id'],
                                name=op.f('fk_event_blocks_device_id_devices')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_event_blocks')),
    )
    op.create_index('ix_event_blocks_device_block', 'event_blocks', ['device_id', 'block_s'])
    op.create_index('ix_event_blocks_block', 'event_blocks', ['block_s'])


def downgrade() -> None:
    op.drop_index('ix_event_blocks_block', table_name='event_blocks')
    op.drop_index('ix_event_blocks_device_block', table_name='event_blocks')
    op.drop_table('event_blocks')
