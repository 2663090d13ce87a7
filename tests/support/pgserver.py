"""A real PostgreSQL server for tests: ``initdb`` into a temp dir, ``pg_ctl`` on a free loopback
port, run as the ``postgres`` user when we are root (PostgreSQL refuses to run as root).

Used by the ``postgres_url`` fixture in ``conftest.py`` and by tests that restart the server.
``.ci/run`` may start one up front and pass ``VRAMSCOPE_TEST_POSTGRES_URL`` instead.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time


def _find_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self) -> None:
        self.initdb = _find_bin("initdb")
        self.pg_ctl = _find_bin("pg_ctl")
        if not self.initdb or not self.pg_ctl:
            raise RuntimeError("PostgreSQL server binaries (initdb, pg_ctl) not found; "
                               "install them with: apt-get install postgresql")
        self.root = tempfile.mkdtemp(prefix="vramscope-pg-")
        self.datadir = os.path.join(self.root, "data")
        self.port = free_port()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
            os.chmod(self.root, 0o700)
        self._run([self.initdb, "-D", self.datadir, "-U", "postgres", "-A", "trust",
                   "--no-sync", "-E", "UTF8"])

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, cmd: list[str]) -> None:
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def start(self) -> None:
        opts = f"-p {self.port} -h 127.0.0.1 -k {self.root} -c fsync=off"
        self._run([self.pg_ctl, "-D", self.datadir, "-o", opts, "-l",
                   os.path.join(self.root, "log"), "-w", "-t", "60", "start"])
        self._wait_ready()

    def stop(self, mode: str = "fast") -> None:
        self._run([self.pg_ctl, "-D", self.datadir, "-m", mode, "-w", "stop"])

    def restart(self) -> None:
        self.stop()
        self.start()

    def _wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"PostgreSQL did not start on port {self.port}")

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)


if __name__ == "__main__":  # used by .ci/run: start one, print its URL, keep it running
    import sys

    server = PostgresServer()
    server.start()
    print(server.url, server.root, server.pg_ctl, server.datadir)
    sys.stdout.flush()
