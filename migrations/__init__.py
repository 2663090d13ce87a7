"""Alembic environment and revisions for the schema in ``agent.store.schema``.

Used programmatically by ``agent.store.migrate`` (no alembic.ini needed): the store passes its
open connection through ``config.attributes["connection"]``.
"""
