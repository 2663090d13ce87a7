"""what the agent refused, by reason, in its stats

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06 09:00:00

``agent_stats`` gains ``rejected_by_reason``: the agent's ingest refusals since its start by
reason (``names``, ``budget_rows``, ``chatter``, ``schema``...; docs/protocol.md), as a JSON
object of counts, beside the ``rejected_total`` it sums to. The dashboard's health table shows
them, as ``vramscope status`` does (issue 45: a new server's records refused for a name bound
read as a bare total). The reasons are an open set (a new check adds one), so one JSON column
rather than one column per reason; null on the rows written before this revision.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('agent_stats') as batch:
        batch.add_column(sa.Column('rejected_by_reason', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('agent_stats') as batch:
        batch.drop_column('rejected_by_reason')
