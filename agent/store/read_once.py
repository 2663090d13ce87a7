"""One request's repeated look-ups, read once.

A private part of the store's reader (:mod:`vramscope.agent.store.reader`). A timeline read
asks the same few questions from several of its parts: where the device's raw samples begin
(the series, the phases and both per-process reads), how many raw rows the window holds (the
series and both per-process reads), where the per-second tier ends (the series, the phases,
the request rate), the host's processes. Each was a statement of its own, and on PostgreSQL a
statement costs a round trip and SQLAlchemy's work around it whatever it reads: the device
page's figure request made 60 of them. Within :func:`reading`, :func:`once` answers a question
asked before from the first answer.

The answers are kept for one call of the reader only (a context variable: each request's
thread has its own), so they are as fresh as that call; outside :func:`reading` every question
is read as asked.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")

_answers: ContextVar[dict[Hashable, Any] | None] = ContextVar("read_once", default=None)


@contextmanager
def reading() -> Iterator[None]:
    """Within it, :func:`once` reads each question once (nested: the outermost keeps them)."""
    if _answers.get() is not None:
        yield
        return
    token = _answers.set({})
    try:
        yield
    finally:
        _answers.reset(token)


def once(key: Hashable, read: Callable[[], T]) -> T:
    """``read()``, or within :func:`reading` the answer it gave for ``key`` before. ``key``
    names the question whole: the function, the store's engine and every argument."""
    answers = _answers.get()
    if answers is None:
        return read()
    if key not in answers:
        answers[key] = read()
    return answers[key]  # type: ignore[no-any-return]
