"""idempotent import: a content key per imported sample and event

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06 05:30:00

``samples`` and ``events`` gain ``content_key``: for a row ``vramscope import`` wrote, a 64-bit
digest of the row as stored (``agent/store/content_keys.py``); NULL for the live agent's rows.
A unique index over (ts_s, content_key), partial (``WHERE content_key IS NOT NULL``), lets
import skip what is already stored (``INSERT ... ON CONFLICT DO NOTHING`` on both backends),
so a file imported twice, or files that overlap, store no row twice. Time comes first in the
index: a trace's rows arrive in time order, so they are added at the index's end rather than
all over it; and the live agent's rows are not in it at all.

The columns are added without a rebuild (SQLite's ADD COLUMN; on PostgreSQL the partitioned
``samples`` passes it to its partitions), the indexes start empty: rows imported before this
revision have no key, and an import does not match them.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None

_TABLES = ('samples', 'events')


def upgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column('content_key', sa.BigInteger(), nullable=True))
        op.create_index(f'uq_{table}_ts_content_key', table, ['ts_s', 'content_key'],
                        unique=True, sqlite_where=sa.text('content_key IS NOT NULL'),
                        postgresql_where=sa.text('content_key IS NOT NULL'))


def downgrade() -> None:
    for table in reversed(_TABLES):
        op.drop_index(f'uq_{table}_ts_content_key', table_name=table)
        with op.batch_alter_table(table) as batch:
            batch.drop_column('content_key')
