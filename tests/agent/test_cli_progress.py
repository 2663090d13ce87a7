"""Long work shows its progress (issue 46, item 7): ``import``, ``analyze FILE``, ``export``,
``replay`` and ``db upgrade`` redraw one line on stderr when it is a terminal (a real
pseudo-terminal here), and print nothing more when it is piped or with ``--json``."""

from __future__ import annotations

import gzip
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from vramscope.agent.cli import progress
from vramscope.agent.cli.progress import BYTES, Progress, amount
from vramscope.agent.clock import FakeClock
from vramscope.agent.records import Event, Phase, Sample
from vramscope.agent.store import migrate
from vramscope.agent.trace import WRITTEN_EVERY, iter_trace, read_trace, write_sorted_trace

from tools.agent_process import REPO_ROOT, AgentProcess

DATA = Path(__file__).parent.parent / "data"
MiB = 2**20


class Terminal:
    """A pseudo-terminal: what is written on its ``stream`` comes back from ``read``, as a
    terminal gets it (a newline as CR LF)."""

    MARK = "\x1e"  # written after the text to read: all before it has come through

    def __init__(self) -> None:
        self._reader, writer = pty.openpty()
        self.stream = open(writer, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def read(self) -> str:
        """What was written since the last read (the terminal passes it on asynchronously:
        read up to a mark written after it)."""
        self.stream.write(self.MARK)
        self.stream.flush()
        got = b""
        while not got.endswith(self.MARK.encode()):
            ready, _, _ = select.select([self._reader], [], [], 10.0)
            assert ready, f"the terminal gave {got!r} and then nothing for 10 s"
            got += os.read(self._reader, 65536)
        return got.decode()[:-1]

    def close(self) -> None:
        self.stream.close()
        os.close(self._reader)


@pytest.fixture
def terminal():
    t = Terminal()
    yield t
    t.close()


# --- the line: its parts and when it is drawn, on a fake clock ------------------------------

def test_the_line_shows_done_of_total_rate_and_time_left_redrawn_in_place(terminal):
    clock = FakeClock()
    with Progress("import", BYTES, 252 * MiB, verb="read", stream=terminal.stream,
                  clock=clock) as p:
        assert terminal.read() == "\rimport: 0 B of 252.0 MiB (0%)"
        clock.advance(0.1)
        p.advance(1 * MiB)  # a quarter of a second since the last draw has not passed
        assert terminal.read() == ""
        clock.advance(0.5)
        p.advance(2 * MiB)  # drawn: under a second of work gives no rate yet
        assert terminal.read() == "\rimport: 3.0 MiB of 252.0 MiB (1%)"
        clock.advance(1.4)
        p.advance(117 * MiB)  # 120 MiB in 2 s: 60 MiB/s, 132 MiB to go: 2.2 s
        assert terminal.read() == ("\rimport: 120.0 MiB of 252.0 MiB (47%), 60.0 MiB/s, "
                                   "2.2s left")
        clock.advance(2.2)
        p.advance(132 * MiB)  # all read: no time left to say
        p.stage("storing verdicts and alerts")  # drawn at once, whatever the time
        busy = "import: 252.0 MiB of 252.0 MiB (100%), 60.0 MiB/s; storing verdicts and alerts"
        # padded over the 10 characters more of the line before it
        assert terminal.read() == ("\rimport: 252.0 MiB of 252.0 MiB (100%), 60.0 MiB/s"
                                   + " " * 10 + "\r" + busy)
        clock.advance(177.8)
    # the closing line covers the longer one before it, and ends with a newline
    closing = "import: 252.0 MiB read in 3m02s, 1.4 MiB/s"
    assert terminal.read() == "\r" + closing + " " * (len(busy) - len(closing)) + "\r\n"


def test_the_line_never_runs_past_the_terminal_width(terminal):
    """A wrapped line is not redrawn by a carriage return: each redraw would add a line."""
    clock = FakeClock()
    with Progress("db upgrade", "migrations", 12, verb="run", stream=terminal.stream,
                  clock=clock) as p:
        clock.advance(2.0)
        p.stage("running 0006 " + "x" * 100)
    assert frames(terminal.read()) == [
        "db upgrade: 0 of 12 migrations (0%)",
        ("db upgrade: 0 of 12 migrations (0%), 0.0 migrations/s; running 0006 " + "x" * 100)[:79],
        "db upgrade: 0 migrations run in 2.0s, 0.0 migrations/s"]


def test_a_fraction_by_time_where_there_is_no_count_to_reach(terminal):
    """``export`` does not count its rows beforehand: how far is its place in time."""
    clock = FakeClock()
    with Progress("export", "records", verb="written", stream=terminal.stream,
                  clock=clock) as p:
        clock.advance(4.0)
        p.advance(40_000, fraction=0.25)
        clock.advance(0.1)
        p.advance(1, fraction=0.3)  # counted, drawn at the next redraw
        assert p.done == 40_001
    assert frames(terminal.read()) == [
        "export: 0 records",
        "export: 40,000 records (25%), 10,000 records/s, 12s left",
        "export: 40,001 records written in 4.1s, 9,756 records/s"]


def test_an_error_erases_the_line_for_the_message_that_follows(terminal):
    clock = FakeClock()
    with pytest.raises(ValueError), Progress("replay", "records", 10, verb="sent",
                                             stream=terminal.stream, clock=clock):
        raise ValueError("no agent")
    line = "replay: 0 of 10 records (0%)"
    assert terminal.read() == f"\r{line}\r{' ' * len(line)}\r"


def test_shown_draws_on_a_terminal_only(terminal):
    reader, writer = os.pipe()
    with open(writer, "w") as piped:
        for p in (progress.shown("import", BYTES, 10, verb="read", stream=piped),
                  progress.shown("analyze", BYTES, 10, verb="read", quiet=True,
                                 stream=terminal.stream),
                  # export writing its trace to the same terminal: the line would break it
                  progress.shown("export", "records", verb="written", stream=terminal.stream,
                                 output=terminal.stream)):
            with p:
                p.advance(10)
            assert p.done == 10  # counted all the same
    assert os.read(reader, 100) == b""
    os.close(reader)
    assert terminal.read() == ""
    with progress.shown("import", BYTES, 10, verb="read", stream=terminal.stream):
        pass
    assert terminal.read().startswith("\rimport: 0 B of 10 B (0%)\rimport: 0 B read in ")


@pytest.mark.parametrize(("seconds", "text"), [(0.04, "0.0s"), (9.94, "9.9s"), (42.4, "42s"),
                                               (182.0, "3m02s"), (3900.0, "1h05m")])
def test_durations(seconds, text):
    assert progress.duration(seconds) == text


@pytest.mark.parametrize(("n", "unit", "text"), [
    (512, BYTES, "512 B"), (49_459, BYTES, "48.3 KiB"), (252 * MiB, BYTES, "252.0 MiB"),
    (3 * 2**30, BYTES, "3.0 GiB"), (1, "records", "1 record"),
    (1_234_567, "records", "1,234,567 records")])
def test_amounts(n, unit, text):
    assert amount(n, unit) == text


# --- what is counted -----------------------------------------------------------------------

def test_the_bytes_read_are_the_files_bytes_each_once(tmp_path):
    """The plain file's bytes; a gzip file's compressed bytes (what is read from the disk),
    its magic counted once though read twice."""
    plain = DATA / "gpu_oom.jsonl"
    packed = tmp_path / "gpu_oom.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    for path in (plain, packed):
        told: list[int] = []
        chunks = list(iter_trace(str(path), on_read=told.append))
        assert sum(told) == path.stat().st_size
        assert chunks == list(iter_trace(str(path)))  # the same records as without counting
    told = []
    assert read_trace(str(packed), on_read=told.append) == read_trace(str(plain))
    assert sum(told) == packed.stat().st_size


def test_export_is_told_of_its_first_line_every_batch_and_the_last():
    samples = [Sample(1000.0 + i, 0, Phase.IDLE, "t", allocated_bytes=i) for i in range(2500)]
    events = [Event(1000.5, "request_start", 0)]
    told: list[tuple[int, float]] = []
    out = open(os.devnull, "w")  # noqa: SIM115
    with out:
        n = write_sorted_trace(out, samples, events, on_written=lambda k, ts: told.append((k, ts)))
    assert n == 2501
    # line 2 is the event at 1000.5; line k (k > 2) is the sample at 1000 + k - 2
    assert told == [(1, 1000.0), (WRITTEN_EVERY, 1000.0 + WRITTEN_EVERY - 1),
                    (WRITTEN_EVERY, 1000.0 + 2 * WRITTEN_EVERY - 1),
                    (2501 - 2 * WRITTEN_EVERY - 1, 3499.0)]


# --- the commands, on a pseudo-terminal ----------------------------------------------------

def run_cli(args: list[str], *, on_terminal: bool) -> tuple[str, str]:
    """``vramscope ARGS`` with stderr a pseudo-terminal or a pipe: (stdout, stderr)."""
    cmd = [sys.executable, "-m", "vramscope.agent", *args]
    if not on_terminal:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
                              check=True)
        return done.stdout, done.stderr
    reader, writer = pty.openpty()
    got: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(reader, 65536)
            except OSError:  # EIO: every writer of the terminal has closed it
                return
            if not chunk:
                return
            got.append(chunk)

    drainer = threading.Thread(target=drain)
    drainer.start()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=writer, text=True,
                            cwd=REPO_ROOT)
    os.close(writer)
    out, _ = proc.communicate(timeout=120)
    drainer.join(timeout=30)
    os.close(reader)
    assert proc.returncode == 0, b"".join(got).decode()
    return out, b"".join(got).decode().replace("\r\n", "\n")


def frames(stderr: str) -> list[str]:
    """The lines the terminal showed one after another, padding stripped."""
    return [f.rstrip() for f in re.split(r"[\r\n]", stderr) if f.strip()]


def drawn_line(label: str, total: str) -> re.Pattern[str]:
    return re.compile(rf"{label}: \d+(\.\d)? (B|KiB|MiB) of {re.escape(total)} \((\d+)%\)"
                      r"(, \d+(\.\d)? (B|KiB|MiB)/s(, \S+ left)?)?"
                      r"(; storing verdicts and alerts)?")


def test_import_on_a_terminal_shows_the_file_read_and_prints_the_same(tmp_path):
    trace = DATA / "gpu_pair_leak.jsonl.gz"
    size = amount(trace.stat().st_size, BYTES)  # compressed: what is read
    out, err = run_cli(["import", str(trace), "--db", str(tmp_path / "t.db")], on_terminal=True)
    shown = frames(err)
    assert shown[0] == f"import: 0 B of {size} (0%)"
    assert all(drawn_line("import", size).fullmatch(f) for f in shown[1:-1]), shown
    # every byte of the file counted before the verdicts are stored
    assert shown[-2].startswith(f"import: {size} of {size} (100%)")
    assert shown[-2].endswith("; storing verdicts and alerts")
    assert re.fullmatch(rf"import: {re.escape(size)} read in \d+\.\ds, \d+(\.\d)? (B|KiB|MiB)/s",
                        shown[-1])
    assert err.endswith("\n") and err.count("\n") == 1  # the closing line only is kept
    piped = run_cli(["import", str(trace), "--db", str(tmp_path / "piped.db")],
                    on_terminal=False)
    assert piped == (out.replace("t.db", "piped.db"), "")  # piped: no progress, same output
    assert out.startswith(f"{trace}: imported 609 samples and 2443 events\n")


def test_analyze_shows_its_reading_on_a_terminal_and_nothing_with_json():
    trace = DATA / "gpu_oom.jsonl"
    size = amount(trace.stat().st_size, BYTES)
    text, err = run_cli(["analyze", str(trace)], on_terminal=True)
    shown = frames(err)
    assert shown[0] == f"analyze: 0 B of {size} (0%)"
    assert re.fullmatch(rf"analyze: {re.escape(size)} read in \d+\.\ds, .*/s", shown[-1])
    assert run_cli(["analyze", str(trace)], on_terminal=False) == (text, "")
    doc, err = run_cli(["analyze", "--json", str(trace)], on_terminal=True)
    assert err == ""
    assert doc == run_cli(["analyze", "--json", str(trace)], on_terminal=False)[0]


def test_export_and_db_upgrade_on_a_terminal(tmp_path):
    db = str(tmp_path / "t.db")
    _, err = run_cli(["db", "upgrade", "--db", db], on_terminal=True)
    steps = len(migrate.known_revisions())
    first = sorted(migrate.known_revisions())[0]
    shown = frames(err)
    assert shown[0] == f"db upgrade: 0 of {steps} migrations (0%); running {first}"
    assert re.fullmatch(rf"db upgrade: {steps} migrations run in \d+\.\ds, .* migrations/s",
                        shown[-1])
    assert run_cli(["db", "upgrade", "--db", db], on_terminal=True)[1] == ""  # none to run
    run_cli(["import", str(DATA / "gpu_oom.jsonl"), "--db", db], on_terminal=False)
    lines = len(read_trace(str(DATA / "gpu_oom.jsonl")).samples) + len(
        read_trace(str(DATA / "gpu_oom.jsonl")).events)
    _, err = run_cli(["export", "--db", db, "-o", str(tmp_path / "out.jsonl")],
                     on_terminal=True)
    shown = frames(err)
    assert shown[0] == "export: 0 records"
    assert all(re.fullmatch(r"export: [\d,]+ records? \(\d+%\)(, [\d,.]+ records/s, \S+ left)?", f)
               for f in shown[1:-2]), shown
    assert re.fullmatch(rf"export: {lines:,} records written in \d+\.\ds, [\d,.]+ records/s",
                        shown[-2])
    assert shown[-1] == f"{tmp_path / 'out.jsonl'}: wrote {lines} lines"
    # to stdout, piped: the same lines, the progress still on the terminal
    out, err = run_cli(["export", "--db", db], on_terminal=True)
    assert out == (tmp_path / "out.jsonl").read_text()
    assert frames(err)[-1].startswith(f"export: {lines:,} records written in ")


@pytest.fixture
def agent_proc():
    root = tempfile.mkdtemp(prefix="vs-agent-", dir="/tmp")  # short: AF_UNIX paths <= 107 bytes
    proc = AgentProcess(f"sqlite:///{root}/vramscope.db", f"{root}/run/agent.sock",
                        fake_devices=1, log_path=f"{root}/agent.log").start()
    yield proc
    proc.stop()
    shutil.rmtree(root, ignore_errors=True)


def test_replay_shows_the_file_read_then_the_records_sent(agent_proc, tmp_path):
    trace = tmp_path / "t.jsonl"
    now = time.time() - 1300  # inside the agent's time window, none ahead of its clock
    trace.write_text("".join(f'{{"ts": {now + i}, "device": 0, "source": "replayed", '
                             f'"reserved_bytes": {i}}}\n' for i in range(1200)))
    size = amount(trace.stat().st_size, BYTES)
    out, err = run_cli(["replay", str(trace), "--socket", agent_proc.socket_path,
                        "--as-fast-as-possible"], on_terminal=True)
    assert out == f"replayed 1200 records from {trace}\n"
    closing = [f for f in frames(err) if " in " in f]
    assert [re.sub(r" in .*", "", f) for f in closing] == [f"replay: {size} read",
                                                            "replay: 1,200 records sent"]
    assert "replay: 0 of 1,200 records (0%)" in frames(err)
