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


# (name, type, nullable) of each column after the id, as 0015's sample blocks less the source
_COLUMNS = (('device_id', sa.Integer, False), ('block_s', sa.Float, False),
            ('pid', sa.Integer, True), ('first_s', sa.Float, False), ('last_s', sa.Float, False),
            ('count', sa.Integer, False), ('keyed', sa.Integer, False),
            ('data', sa.LargeBinary, False))
_INDEXES = {'ix_event_blocks_device_block': ['device_id', 'block_s'],
            'ix_event_blocks_block': ['block_s']}


def upgrade() -> None:
    op.create_table(
        'event_blocks', sa.Column('id', sa.Integer(), nullable=False),
        *(sa.Column(name, kind(), nullable=nullable) for name, kind, nullable in _COLUMNS),
        sa.ForeignKeyConstraint(['device_id'], ['devices.id'],
                                name=op.f('fk_event_blocks_device_id_devices')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_event_blocks')))
    for name, columns in _INDEXES.items():
        op.create_index(name, 'event_blocks', columns)


def downgrade() -> None:
    for name in _INDEXES:
        op.drop_index(name, table_name='event_blocks')
    op.drop_table('event_blocks')
