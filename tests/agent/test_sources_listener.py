"""The pid behind a port, read from the real /proc of this Linux host: sockets this test opens
(IPv4 and IPv6, listening or not) and the names that count as this host."""

from __future__ import annotations

import os
import socket

import pytest
from vramscope.agent.sources import listener


def _listening(family: socket.AddressFamily, address: str) -> socket.socket:
    s = socket.socket(family)
    s.bind((address, 0))
    s.listen()
    return s


@pytest.mark.parametrize(("family", "address"), [(socket.AF_INET, "127.0.0.1"),
                                                 (socket.AF_INET, "0.0.0.0"),
                                                 (socket.AF_INET6, "::1")])
def test_the_process_listening_on_a_port_is_found(family, address):
    with _listening(family, address) as s:
        port = s.getsockname()[1]
        assert len(listener.listening_inodes(port)) == 1
        assert listener.pid_listening(port) == os.getpid()


def test_a_bound_socket_that_does_not_listen_and_a_closed_port_are_no_one():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert listener.pid_listening(port) is None  # bound, not listening
    assert listener.pid_listening(port) is None  # closed


def test_a_missing_proc_is_no_answer_not_an_error(tmp_path):
    assert listener.listening_inodes(8000, proc=str(tmp_path)) == set()
    assert listener.pid_listening(8000, proc=str(tmp_path)) is None


@pytest.mark.parametrize(("host", "local"), [
    ("127.0.0.1", True), ("127.0.0.53", True), ("localhost", True), ("LOCALHOST", True),
    ("[::1]", True), (socket.gethostname(), True), ("10.0.0.7", False), ("gpu-node-2", False),
    ("[2001:db8::1]", False), ("", False)])
def test_which_hosts_are_this_one(host, local):
    assert listener.is_local_host(host) is local
