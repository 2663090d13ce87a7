"""A blocking client connection to the agent: for ``replay``, ``status``, benchmarks and tests.

Unlike the in-server ``vramscope.hooks.client.SocketSink`` it waits for the socket instead of
dropping:
a load generator must deliver everything it was asked to send.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence
from typing import Any

from vramscope.agent.errors import VramscopeError
from vramscope.agent.ingest import protocol as proto


class AgentConnection:
    def __init__(self, path: str, *, timeout_s: float = 10.0) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        try:
            self.sock.connect(path)
        except OSError as exc:
            self.sock.close()
            raise VramscopeError(f"cannot connect to the agent at {path}: {exc.strerror or exc}; "
                                 f"is `vramscope agent` running (check --socket)?") from None

    def hello(self, process: str = "vramscope-replay", devices: Sequence[int] = (),
              pid: int | None = None, protocol: int = proto.PROTOCOL_VERSION) -> dict[str, Any]:
        """Send the hello; return the agent's reply; raise if it refused."""
        self.sock.sendall(proto.hello(os.getpid() if pid is None else pid, process, devices,
                                      protocol=protocol))
        reply = self.read()
        if reply.get("type") != "welcome":
            raise VramscopeError(f"the agent refused the connection: "
                                 f"{reply.get('message', reply)}")
        return reply

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_records(self, records: Sequence[Any]) -> None:
        self.sock.sendall(proto.records_message(records))

    def status(self) -> dict[str, Any]:
        self.sock.sendall(proto.frame({"type": "status"}))
        return self.read()

    def read(self) -> dict[str, Any]:
        (length,) = proto.HEADER.unpack(self._recv_exact(proto.HEADER_BYTES))
        if length > 64 * proto.DEFAULT_MAX_MESSAGE_BYTES:
            raise VramscopeError(f"reply of {length} bytes from {self.path} is too large")
        reply: dict[str, Any] = json.loads(self._recv_exact(length))
        return reply

    def _recv_exact(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            chunk = self.sock.recv(left)
            if not chunk:
                raise ConnectionError(f"the agent at {self.path} closed the connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> AgentConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
