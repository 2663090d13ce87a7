"""The alert engine on the second core: a consumer of record batches run in a child process.

``vramscope import`` and ``analyze FILE`` spend their time decoding the trace (and writing it,
or summarising it) and in the alert engine, about equally, and neither waits for the other: on
a machine with two cores this process decodes and hands each batch to a child process that runs
the consumer (the engine). The answer is the same function's over the same batches, in the same
order; only where it runs differs. The child is started with ``spawn`` (nothing of this
process's connections or threads is inherited), which costs a fresh interpreter's imports: a
small input is consumed here instead (:func:`worth_a_child`). Batches cross the pipe as pickles
of plain tuples, made records again by ``tuple.__new__`` of their class (a pickled
``NamedTuple`` is rebuilt through its Python ``__new__``, one call per record).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import queue
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any, Generic, TypeVar

from vramscope.agent.errors import VramscopeError
from vramscope.agent.records import Event, Sample
from vramscope.agent.trace import GZIP_MAGIC

R = TypeVar("R")
Batch = tuple[list[Sample], list[Event]]

# Inputs of at least this many bytes (a gzip file counted at GZIP_RATIO times its size) are
# consumed in a child: below, a second of start-up is more than the second core saves.
CHILD_MIN_BYTES = 64 * 2**20
GZIP_RATIO = 8  # a trace line compresses about this much (JSON keys repeat on every line)
_END = b""
GC_ALLOCATIONS = 100_000  # see fewer_collections
QUEUED = 16  # batches received ahead of the consumer (a batch: 4,096 records, ~0.5 MB)


class ChildFailed(VramscopeError):
    """The consumer raised in the child; the message carries its traceback."""


def worth_a_child(paths: Iterable[str]) -> bool:
    """True when the files are large enough to be worth a second process, and the machine
    has a second core to give it."""
    if (os.cpu_count() or 1) < 2:
        return False
    total = 0
    for path in paths:
        try:
            with open(path, "rb") as fh:
                ratio = GZIP_RATIO if fh.read(2) == GZIP_MAGIC else 1
            total += os.path.getsize(path) * ratio
        except OSError:
            return False  # the reader reports it, with the line it names
    return total >= CHILD_MIN_BYTES


def pack(samples: Sequence[Sample], events: Sequence[Event]) -> bytes:
    return pickle.dumps(([tuple(s) for s in samples], [tuple(e) for e in events]),
                        protocol=pickle.HIGHEST_PROTOCOL)


# tuple.__new__ of the class, in C: NamedTuple's _make checks the length in Python, which
# pack's own tuples need not
_AS_SAMPLE = partial(tuple.__new__, Sample)
_AS_EVENT = partial(tuple.__new__, Event)


def unpack(data: bytes) -> Batch:
    samples, events = pickle.loads(data)
    return list(map(_AS_SAMPLE, samples)), list(map(_AS_EVENT, events))


def consume(consumer: Callable[[Iterator[Batch]], R], batches: Iterable[Batch], *,
            in_child: bool) -> R:
    """``consumer(batches)``, here or (``in_child``) in a child process as ``batches`` are
    produced here. ``consumer`` must be picklable (a module-level function, or a
    ``functools.partial`` of one): the child imports it by name."""
    with fewer_collections():
        if not in_child:
            return consumer(iter(batches))
        with ChildConsumer(consumer) as child:
            for samples, events in batches:
                child.send(samples, events)
            return child.result()


@contextmanager
def fewer_collections() -> Iterator[None]:
    """The cyclic garbage collector run every GC_ALLOCATIONS allocations instead of every 700.
    Decoding and analysing make millions of short-lived tuples of scalars, which form no
    cycles (reference counting frees them), and the collector's passes over them are work for
    nothing (docs/BENCHMARKS.md, `import`); it still runs, less
    often."""
    before = gc.get_threshold()
    gc.set_threshold(GC_ALLOCATIONS, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


class ChildConsumer(Generic[R]):
    """A child process running ``consumer`` over the batches sent to it."""

    def __init__(self, consumer: Callable[[Iterator[Batch]], R]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, theirs = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(theirs, consumer), daemon=True,
                                 name="vramscope-second-core")
        self._proc.start()
        theirs.close()

    def send(self, samples: Sequence[Sample], events: Sequence[Event]) -> None:
        """Hand a batch over; blocks while the child's queue (QUEUED batches) and the pipe are
        full (the child is behind), so the batches in flight are bounded, not the input."""
        try:
            self._conn.send_bytes(pack(samples, events))
        except OSError:  # the child is gone: it failed (its reason is waiting in the pipe)
            self._outcome()
            raise ChildFailed("the second-core process exited before its input ended") from None

    def result(self) -> R:
        """The consumer's return value, once every batch sent is consumed."""
        try:
            self._conn.send_bytes(_END)
        except OSError:
            pass  # it failed; its reason is read below
        return self._outcome()

    def _outcome(self) -> R:
        try:
            kind, payload = pickle.loads(self._conn.recv_bytes())
        except (EOFError, OSError):
            self._proc.join()
            raise ChildFailed(f"the second-core process died (exit code "
                              f"{self._proc.exitcode}) without an answer") from None
        if kind == "error":
            raise ChildFailed(f"in the second-core process:\n{payload}")
        return payload  # type: ignore[no-any-return]

    def __enter__(self) -> ChildConsumer[R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.close()
        self._proc.join(timeout=5.0)
        if self._proc.is_alive():  # an error here left it waiting for input
            self._proc.terminate()
            self._proc.join()


def _serve(conn: Any, consumer: Callable[[Iterator[Batch]], Any]) -> None:
    # A thread drains the pipe into a queue while the consumer works: the parent's send then
    # returns at once unless QUEUED batches are waiting, so neither side waits on the other's
    # slower batch (both run at their own pace, a batch apart at most QUEUED).
    inbox: queue.Queue[bytes | None] = queue.Queue(maxsize=QUEUED)

    def receive() -> None:
        try:
            while (data := conn.recv_bytes()) != _END:
                inbox.put(data)
            inbox.put(_END)
        except (EOFError, OSError):
            inbox.put(None)  # the parent went away without the end

    threading.Thread(target=receive, name="vramscope-second-core-inbox", daemon=True).start()
    ended = False

    def batches() -> Iterator[Batch]:
        nonlocal ended
        while (data := inbox.get()) != _END:
            if data is None:
                raise EOFError("the parent process closed the pipe before the end")
            yield unpack(data)
        ended = True

    try:
        with fewer_collections():
            result = consumer(batches())
        while not ended and inbox.get() not in (_END, None):  # a consumer that stopped early
            pass
        answer = ("ok", result)
    except BaseException:  # noqa: BLE001 - everything goes back to the parent, which raises
        answer = ("error", traceback.format_exc())
    try:
        conn.send_bytes(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))
    except OSError:
        pass  # the parent is gone: nobody to answer
