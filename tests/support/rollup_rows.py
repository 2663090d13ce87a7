"""The rollup rows a store holds, in (bucket, device, source, metric) order: what the tests of
retention and the rollup tiers compare against (the product reads rollups through the reader)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from vramscope.agent.store.schema import rollups

if TYPE_CHECKING:
    from vramscope.agent.store.store import Store


def read_rollups(store: Store, device_id: int | None = None) -> list[dict[str, Any]]:
    q = select(rollups).order_by(rollups.c.bucket_s, rollups.c.device_id, rollups.c.source,
                                 rollups.c.metric)
    if device_id is not None:
        q = q.where(rollups.c.device_id == device_id)
    with store.engine.connect() as c:
        return [dict(r._mapping) for r in c.execute(q)]
