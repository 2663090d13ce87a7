"""The store: the only package that imports SQLAlchemy (DESIGN.md rule 3)."""

from vramscope.agent.store.store import Store

__all__ = ["Store"]
