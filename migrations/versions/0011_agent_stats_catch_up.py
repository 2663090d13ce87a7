"""retention's catch-up progress in the agent's stats

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04 18:00:00

``agent_stats`` gains ``retention_behind_s`` (data time retention still has to roll up) and
``retention_eta_s`` (how long that takes at the rate so far), both null when retention is not
behind: the dashboard's sampling health shows an agent catching up after downtime, as
``vramscope status`` does.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('agent_stats') as batch:
        batch.add_column(sa.Column('retention_behind_s', sa.Float(), nullable=True))
        batch.add_column(sa.Column('retention_eta_s', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('agent_stats') as batch:
        batch.drop_column('retention_eta_s')
        batch.drop_column('retention_behind_s')
