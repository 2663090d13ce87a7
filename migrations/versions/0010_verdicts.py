"""the alert engine's verdicts per device and process

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04 17:00:00

``verdicts`` keeps the engine's answers (leak state and slope, OOM risk level, time to OOM and
cause, KV state) per device and process, written when they change and at a heartbeat by the
live agent, ``import`` and ``replay`` (agent/alerts/verdicts.py). Every page and command reads
them instead of deciding again. Empty on upgrade: an older store's records get verdicts from
``vramscope import`` of their export, or from the agent from now on.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'verdicts',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('device_id', sa.Integer(), nullable=False),
        sa.Column('pid', sa.Integer(), nullable=True),
        sa.Column('ts_s', sa.Float(), nullable=False),
        sa.Column('leak_state', sa.String(length=24), nullable=False),
        sa.Column('risk_level', sa.String(length=16), nullable=False),
        sa.Column('doc', sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(['device_id'], ['devices.id'],
                                name=op.f('fk_verdicts_device_id_devices')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_verdicts')),
    )
    op.create_index('ix_verdicts_device_pid_ts', 'verdicts', ['device_id', 'pid', 'ts_s'])
    op.create_index('ix_verdicts_device_ts', 'verdicts', ['device_id', 'ts_s'])


def downgrade() -> None:
    op.drop_index('ix_verdicts_device_ts', table_name='verdicts')
    op.drop_index('ix_verdicts_device_pid_ts', table_name='verdicts')
    op.drop_table('verdicts')
