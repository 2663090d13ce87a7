"""rollups: a WITHOUT ROWID table on SQLite (the primary key is the table)

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 02:00:00

A rowid table with a four-column primary key keeps every rollup twice: the row, and the key
again in a separate index (41 of the 100 bytes a row on SQLite). Clustered on its primary key
``(device_id, bucket_s, source, metric)``, a device's range of minutes is one B-tree range with
the values in it, no lookup per row: the long timelines and the capacity page read it. SQLite
only; on PostgreSQL the table is unchanged (the rebuild copies every rollup once).
"""
from __future__ import annotations

from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def _rebuild(with_rowid: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    with op.batch_alter_table("rollups", recreate="always",
                              table_kwargs={"sqlite_with_rowid": with_rowid}):
        pass


def upgrade() -> None:
    _rebuild(False)


def downgrade() -> None:
    _rebuild(True)
