"""device identity: devices joined by UUID (MIG parents), process ranks and namespace pids

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 00:50:00

Old rows keep working: existing devices keep their (host, index); a record without a UUID still
joins on it. Several NULL uuids never conflict with the new unique (host_id, uuid).
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # one UUID names one device of a host: of duplicates (a hand-made fake), the first keeps it
    op.execute("UPDATE devices SET uuid = NULL WHERE uuid IS NOT NULL AND id NOT IN "
               "(SELECT MIN(id) FROM devices WHERE uuid IS NOT NULL GROUP BY host_id, uuid)")
    # Plain ALTER TABLE and CREATE INDEX: a batch rebuild of devices would drop a table that
    # samples, events, alerts and post-mortems reference (SQLite refuses with foreign keys on).
    op.add_column('devices', sa.Column('parent_uuid', sa.String(length=80), nullable=True))
    op.add_column('devices', sa.Column('physical_index', sa.Integer(), nullable=True))
    op.create_index('uq_devices_host_uuid', 'devices', ['host_id', 'uuid'], unique=True)
    with op.batch_alter_table('processes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('rank', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('local_rank', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('world_size', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('ns_pid', sa.Integer(), nullable=True))
    # a GPU's physical index is its index (rows written before MIG slices were devices)
    op.execute("UPDATE devices SET physical_index = device_index")


def downgrade() -> None:
    with op.batch_alter_table('processes', schema=None) as batch_op:
        batch_op.drop_column('ns_pid')
        batch_op.drop_column('world_size')
        batch_op.drop_column('local_rank')
        batch_op.drop_column('rank')
    op.drop_index('uq_devices_host_uuid', table_name='devices')
    op.drop_column('devices', 'physical_index')  # SQLite >= 3.35 drops a column in place
    op.drop_column('devices', 'parent_uuid')
