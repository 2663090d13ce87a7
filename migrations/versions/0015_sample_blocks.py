"""the compact raw tier: closed intervals of raw samples as blocks of compressed columns

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07 06:00:00

``sample_blocks`` holds, per device, source, pid and ten-minute interval, the interval's raw
samples as compressed columns (agent/store/block_codec.py), about a tenth of what their rows
in ``samples`` and its indexes cost. The migration only adds the table: an existing store's
rows move into blocks through compaction itself (agent/store/sample_blocks.py), which the
agent holding the store-wide lock runs after the upgrade, one interval per transaction, oldest
first. It can stop at any point (the agent stopped, the database restarted) and reads stay
exact: a read takes the rows of ``samples`` and of the blocks together. Downgrading drops the
table and the samples it holds (compaction cannot be undone by the migration).
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'sample_blocks',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('device_id', sa.Integer(), nullable=False),
        sa.Column('block_s', sa.Float(), nullable=False),
        sa.Column('source', sa.String(length=32), nullable=True),
        sa.Column('pid', sa.Integer(), nullable=True),
        sa.Column('first_s', sa.Float(), nullable=False),
        sa.Column('last_s', sa.Float(), nullable=False),
        sa.Column('count', sa.Integer(), nullable=False),
        sa.Column('keyed', sa.Integer(), nullable=False),
        sa.Column('data', sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(['device_id'], ['devices.id'],
                                name=op.f('fk_sample_blocks_device_id_devices')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_sample_blocks')),
    )
    op.create_index('ix_sample_blocks_device_block', 'sample_blocks', ['device_id', 'block_s'])
    op.create_index('ix_sample_blocks_block', 'sample_blocks', ['block_s'])


def downgrade() -> None:
    op.drop_index('ix_sample_blocks_block', table_name='sample_blocks')
    op.drop_index('ix_sample_blocks_device_block', table_name='sample_blocks')
    op.drop_table('sample_blocks')
