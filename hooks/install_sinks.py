"""The sinks ``install()`` puts in front of the one that ships records, and its fallback.

Every record the hooks make passes :class:`SampledDevices` (which devices this process sent
samples of: ``uninstall()`` says ``process_exit`` on each) and :class:`DeviceIdentitySink`
(each record stamped with its GPU's UUID) before the sink given to ``install()`` or the socket
client; :class:`DropSink` counts and drops what no sink could take. Like every sink, they never
block and never raise into the server (``sink.py``). Kept apart from ``install.py``, which
decides what to turn on.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from vramscope.agent.records import Sample
from vramscope.hooks.sink import Record, RecordSink


class DropSink:
    """Where records go when no sink could be made: counted, then dropped."""

    def __init__(self) -> None:
        self.dropped = 0

    def put(self, record: Record) -> None:
        self.dropped += 1

    def close(self) -> None:
        pass


class DeviceIdentitySink:
    """Stamps each record with its device's UUID, so the agent joins it to the right GPU.

    Every hook record names torch's *logical* index (``cuda:0``), which ``CUDA_VISIBLE_DEVICES``
    and container runtimes renumber; the UUID is the same for the agent, NVML and the server.
    UUIDs are read once per device, and only once CUDA is initialized (reading them would
    initialize it); records before that keep their index alone. Never raises.
    """

    def __init__(self, sink: RecordSink, torch: ModuleType) -> None:
        self.sink = sink
        self._torch = torch
        self._uuids: dict[int, str | None] = {}

    def put(self, record: Record) -> None:
        try:
            if getattr(record, "device_uuid", False) is None:
                uuid = self._uuid(record.device)
                if uuid is not None:
                    record = record._replace(device_uuid=uuid)
        except Exception:  # noqa: BLE001 - the record goes on without its UUID
            pass
        self.sink.put(record)

    def _uuid(self, device: int) -> str | None:
        if device in self._uuids:
            return self._uuids[device]
        if not self._torch.cuda.is_initialized():
            return None
        from vramscope.hooks.allocator import device_uuid

        uuid = self._uuids[device] = device_uuid(self._torch, device)
        return uuid

    def close(self) -> None:
        self.sink.close()

    def __getattr__(self, name: str) -> Any:  # dropped, errors, ... of the wrapped sink
        return getattr(self.sink, name)


class SampledDevices:
    """Notes the devices this process sent samples of (``process_exit`` is said on each), then
    hands every record on. A set add per sample: no lock, never raises."""

    def __init__(self, sink: RecordSink) -> None:
        self.sink = sink
        self.devices: set[int] = set()

    def put(self, record: Record) -> None:
        if type(record) is Sample:
            self.devices.add(record.device)
        self.sink.put(record)

    def close(self) -> None:
        self.sink.close()

    def __getattr__(self, name: str) -> Any:  # dropped, errors, ... of the wrapped sink
        return getattr(self.sink, name)
