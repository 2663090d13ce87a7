"""The store: the only package that imports SQLAlchemy (docs/architecture.md rule 3)."""

from vramscope.agent.store.store import Store

__all__ = ["Store"]
