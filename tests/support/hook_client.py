"""A hook client in a process of its own, for tests with a real agent (``python -m
tests.support.hook_client SOCKET NAME PHYSICAL RESERVED_GIB``).

It runs the hooks' own path (an ``AllocatorSource`` per visible device, the
``DeviceIdentitySink`` that stamps UUIDs, the ``SocketSink`` to the agent) over a stand-in for
torch that sees the GPUs a server started with ``CUDA_VISIBLE_DEVICES=<PHYSICAL>`` sees: logical
index i is physical GPU PHYSICAL[i], and only its UUID (``GPU-fake-000<n>``, the
FakeNvmlSource's) says so. It prints its own pid (as its PID namespace numbers it) once
everything was sent, then stays connected until its stdin closes.
"""

from __future__ import annotations

import os
import sys
import time
from types import SimpleNamespace

from vramscope.agent.records import Event, Phase
from vramscope.agent.sources.nvml import fake_uuid
from vramscope.hooks.allocator import AllocatorSource, Counters
from vramscope.hooks.client import SocketSink
from vramscope.hooks.install_sinks import DeviceIdentitySink

GiB = 2**30


def visible_torch(physical: list[int]) -> SimpleNamespace:
    props = [SimpleNamespace(uuid=fake_uuid(p), total_memory=80 * GiB) for p in physical]
    cuda = SimpleNamespace(is_initialized=lambda: True, get_device_properties=props.__getitem__,
                           get_per_process_memory_fraction=lambda d: 1.0)
    return SimpleNamespace(cuda=cuda)


def main(socket_path: str, name: str, physical: str, reserved_gib: str) -> int:
    devices = [int(p) for p in physical.split(",")]
    torch = visible_torch(devices)
    socket_sink = SocketSink(socket_path, process=name, devices=tuple(range(len(devices))))
    sink = DeviceIdentitySink(socket_sink, torch)
    reserved = int(float(reserved_gib) * GiB)
    for logical in range(len(devices)):
        counters = Counters(reserved - GiB, reserved - GiB, reserved, 0, 0, 0, 0, 0)
        binding = SimpleNamespace(name="fake", read=lambda d, c=counters: c)
        src = AllocatorSource(logical, torch_module=torch, binding=binding)
        sink.put(src.read())
        sink.put(Event(time.time(), "phase", logical, os.getpid(), Phase.DECODE))
    deadline = time.monotonic() + 20
    while socket_sink.sent_total < 2 * len(devices) and time.monotonic() < deadline:
        time.sleep(0.02)
    print(os.getpid(), socket_sink.sent_total, flush=True)
    sys.stdin.read()  # connected (NVML's process rows are joined to live clients) until EOF
    socket_sink.close()
    return 0 if socket_sink.sent_total >= 2 * len(devices) else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
