"""the device's answer as the alert engine chose it: level, leading processes, config check

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06 16:00:00

``device_verdicts`` keeps, per device, the risk level and which process leads the OOM-risk and
the leak question, as the alert engine chose them (agent/alerts/verdicts.py
``DeviceVerdict``), and the ``[server]`` section's check at the limit the engine judges the
device by (the OOM risk page shows the agent's, not one made again with the dashboard's
config): written when one changes and at the verdicts' heartbeat by the live agent,
``import`` and ``replay``. The pages read the lead from here instead of choosing among the
processes' verdicts with a key of their own (issue 46: an alert named one pid and the page
another). Empty on upgrade: a window before the agent's first row has no stored lead, and a
device with one running process is led by it (docs/analysis.md, "Verdicts").
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'device_verdicts',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('device_id', sa.Integer(), nullable=False),
        sa.Column('ts_s', sa.Float(), nullable=False),
        sa.Column('level', sa.String(length=16), nullable=False),
        sa.Column('risk_pid', sa.Integer(), nullable=True),
        sa.Column('leak_pid', sa.Integer(), nullable=True),
        sa.Column('config_check', sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(['device_id'], ['devices.id'],
                                name=op.f('fk_device_verdicts_device_id_devices')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_device_verdicts')),
    )
    op.create_index('ix_device_verdicts_device_ts', 'device_verdicts', ['device_id', 'ts_s'])


def downgrade() -> None:
    op.drop_index('ix_device_verdicts_device_ts', table_name='device_verdicts')
    op.drop_table('device_verdicts')
