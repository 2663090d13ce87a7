"""Who gives a client slot up when every slot is taken and a new client says hello.

By usefulness first (docs/protocol.md, "Slots"): a client that stored nothing for
``agent.slot_idle_s`` (or since its hello ``agent.handshake_timeout_s`` ago), or is stuck inside
a message that long, gives way, least recently useful first, so slowlorises, idle holders and
chatterers never keep a good client out. Then by uid: while one uid holds more slots than the
newcomer's uid plus one, its least useful client gives way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar


class SlotHolder(Protocol):
    """What the rules read of a connection (times are monotonic seconds)."""

    buf: bytearray  # a partial frame
    opened_s: float
    last_frame_s: float  # the last complete frame
    admitted_s: float | None  # its hello was welcomed
    useful_s: float | None  # a record (or post-mortem) of it was last kept


C = TypeVar("C", bound=SlotHolder)


@dataclass(frozen=True)
class SlotRules:
    handshake_s: float
    slot_idle_s: float

    def victim(self, clients: Sequence[C], uid: Callable[[C], int | None],
               newcomer_uid: int | None, now: float) -> tuple[C, str, str] | None:
        """The client to close for a newcomer, with the reason and message; None: refuse
        the newcomer instead."""
        idle = [c for c in clients if self.unproductive(c, now)]
        if idle:
            conn = min(idle, key=usefulness)
            return (conn, *self.why(conn, now))
        held = Counter(uid(c) for c in clients)
        if not held:
            return None
        most_uid, most = held.most_common(1)[0]
        if most <= held[newcomer_uid] + 1:
            return None
        conn = min((c for c in clients if uid(c) == most_uid), key=usefulness)
        return conn, "fairness", (f"uid {most_uid} holds {most} client slots; its least "
                                  f"useful client gives one to uid {newcomer_uid}")

    def unproductive(self, conn: SlotHolder, now: float) -> bool:
        """May give its slot up: stuck inside a message, or no record kept lately."""
        if conn.buf and now - conn.last_frame_s >= self.handshake_s:
            return True  # a slowloris, whatever it sent before
        if conn.useful_s is not None:
            return now - conn.useful_s >= self.slot_idle_s
        return now - (conn.admitted_s or conn.opened_s) >= self.handshake_s

    def why(self, conn: SlotHolder, now: float) -> tuple[str, str]:
        """``idle`` (no complete message lately) or ``chatter`` (messages, no records)."""
        since = now - (conn.useful_s if conn.useful_s is not None
                       else conn.admitted_s or conn.opened_s)
        if now - conn.last_frame_s >= self.handshake_s:
            return "idle", (f"no complete message for {now - conn.last_frame_s:.1f} s and no "
                            f"record kept in {since:.1f} s while every client slot was taken "
                            "(agent.handshake_timeout_s, agent.slot_idle_s)")
        return "chatter", (f"messages but no record kept in {since:.1f} s while every client "
                           "slot was taken: a slot is for a client that sends records "
                           "(agent.slot_idle_s)")


def usefulness(conn: SlotHolder) -> tuple[float, float]:
    """Orders clients from the least useful: never useful first, then by their last kept
    record, then by their last complete message."""
    return (-float("inf") if conn.useful_s is None else conn.useful_s, conn.last_frame_s)
