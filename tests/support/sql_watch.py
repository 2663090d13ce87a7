"""SQL helpers for store tests: the statements an engine sends while a block runs
(``before_cursor_execute``), and the rows a migration test seeds."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event


@contextmanager
def statements_sent(engine: Any, keep: Callable[[str], bool]
                    ) -> Iterator[list[tuple[str, Any]]]:
    """``(statement, parameters)`` of each statement ``keep`` accepts, in the order sent."""
    sent: list[tuple[str, Any]] = []

    def watch(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if keep(statement):
            sent.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", watch)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", watch)


def insert_one_device(conn: Any) -> None:
    """Host 1 ('h') and its device 1 (index 0), in raw SQL: the rows a migration test needs
    before it writes samples, events or rollups at an old revision, without the Store."""
    from sqlalchemy import text

    conn.execute(text("INSERT INTO hosts (id, name, first_seen_s, last_seen_s) "
                      "VALUES (1, 'h', 0, 0)"))
    conn.execute(text("INSERT INTO devices (id, host_id, device_index) VALUES (1, 1, 0)"))
