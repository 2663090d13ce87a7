"""What a dashboard app holds (``app.extensions["vramscope"]``) and how a request reaches it.

Apart from :mod:`vramscope.dashboard.app` so the blueprints (``api``, ``pages``) read it without
importing the factory that registers them (no import cycle).
"""

from __future__ import annotations

from dataclasses import dataclass

from flask import current_app
from vramscope.agent.clock import Clock
from vramscope.agent.config import Config
from vramscope.agent.store import Store


@dataclass
class DashboardState:
    store: Store
    config: Config
    clock: Clock
    owns_store: bool  # opened by the factory, so closed with the app's server


def state() -> DashboardState:
    """The current app's state (inside a request or an app context)."""
    st: DashboardState = current_app.extensions["vramscope"]
    return st
