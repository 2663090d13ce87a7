"""Alembic environment and revisions for the schema in ``vramscope.agent.store.schema``.

Used programmatically by ``vramscope.agent.store.migrate`` (no alembic.ini needed): the store
passes its
open connection through ``config.attributes["connection"]``.
"""
