"""What each device's samples measured, noted as ``vramscope analyze`` streams them by.

The analysis answers "OOM risk: ok" for a device it could not judge: the risk is headroom under
a limit, and a recording whose samples carry no measurement, or no limit
(``device_total_bytes``), gives none. The text report says so instead (issue 34: "a record with
no measurements yields 'OOM risk: max ok'"); the JSON document is left as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from vramscope.agent.records import SAMPLE_COUNTER_FIELDS, Sample

R = TypeVar("R")


class Measured:
    def __init__(self) -> None:
        self.records = 0
        self.measured: set[int] = set()  # a sample with any counter
        self.limited: set[int] = set()  # a sample with a limit (device_total_bytes)

    def watch(self, records: Iterable[R]) -> Iterator[R]:
        """``records``, unchanged, noting each sample; a device once seen with a limit costs
        one set lookup a sample after that."""
        limited = self.limited
        for r in records:
            self.records += 1
            if isinstance(r, Sample) and r.device not in limited:
                self._note(r)
            yield r

    def _note(self, s: Sample) -> None:
        if s.device_total_bytes is not None:
            self.limited.add(s.device)
        if s.device not in self.measured and any(
                getattr(s, f) is not None for f in SAMPLE_COUNTER_FIELDS):
            self.measured.add(s.device)

    def unjudged(self, device: int) -> str | None:
        """Why the device's OOM risk could not be judged, or None when it could."""
        if device in self.limited:
            return None
        if device in self.measured:
            return ("not judged: no sample gives the memory limit (device_total_bytes), so "
                    "there is no headroom to judge")
        return ("nothing to judge: no sample of this device carries a measurement "
                "(allocated_bytes, device_used_bytes, ...)")
