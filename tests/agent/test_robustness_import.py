"""`vramscope import` of malformed and hostile trace files, as a real process on a real SQLite
database: every problem is one clear `FILE:LINE: what` line (no traceback), several files go
in one transaction, and a large file is streamed."""

from __future__ import annotations

import gzip
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tools.agent_process import REPO_ROOT

GOOD = '{"ts": 1700000000.0, "device": 0, "source": "torch", "allocated_bytes": 1}\n'


def _import(db: Path, *files: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vramscope", "import", *map(str, files),
                           "--db", f"sqlite:///{db}"], capture_output=True, timeout=120,
                          text=True, cwd=str(REPO_ROOT))


def _rows(db: Path) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(db) as c:
        return c.execute("SELECT count(*) FROM samples").fetchone()[0] + c.execute(
            "SELECT count(*) FROM events").fetchone()[0]


DEEP = '{"ts": 1, "event": "oom", "x": ' + "[" * 5000 + "]" * 5000 + "}\n"
NESTED = '{"ts": 1, "event": "oom", "x": ' + "[" * 980 + "]" * 980 + "}\n"


@pytest.mark.parametrize("content, message", [
    (GOOD + '{"ts": 1' + "0" * 400 + "}\n",
     "t.jsonl:2: 'ts' must be a finite number of seconds, got 1000000000000000000000000000000000"
     "000000... (401 characters)"),
    (GOOD + DEEP, "t.jsonl:2: not valid JSON: nested too deeply"),
    (GOOD + NESTED, "t.jsonl:2: event data nests deeper than 16 levels"),
    (GOOD + '{"ts": 1, "source": "\\ud800"}\n',
     "t.jsonl:2: 'source' is not valid Unicode (a lone surrogate): '\\ud800'"),
    (GOOD + '{"ts": 1, "event": "x", "note": "a\\udfffb"}\n',
     "t.jsonl:2: event data value 'a\\udfffb' is not valid Unicode"),
    (GOOD * 2 + '{"ts": 1, "host": "' + "h" * 300 + '"}\n',
     "t.jsonl:3: 'host' is longer than 255 characters (300)"),
])
def test_a_bad_line_is_named_and_nothing_is_written(tmp_path, content, message):
    trace = tmp_path / "t.jsonl"
    trace.write_text(content)
    done = _import(tmp_path / "vs.db", trace)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"vramscope: error: {tmp_path}/{message}" in done.stderr.strip()
    assert _rows(tmp_path / "vs.db") == 0


@pytest.mark.parametrize("content, message", [
    ((GOOD * 2).encode() + b'{"ts": 1, "source": "\xff\xfe"}\n',
     "t.jsonl:3: not UTF-8 at byte 22 of the line: invalid start byte"),
    (GOOD.encode() + b"\x00\x01\x02binary\n", "t.jsonl:2: binary data (a NUL byte), not a JSON "
     "Lines trace"),
    (gzip.compress((GOOD * 3).encode())[:-30], "t.jsonl:1: damaged gzip stream: Compressed "
     "file ended before the end-of-stream marker was reached"),
])
def test_files_that_are_not_utf8_json_lines_are_named_at_their_line(tmp_path, content,
                                                                      message):
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(content)
    done = _import(tmp_path / "vs.db", trace)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"vramscope: error: {tmp_path}/{message}" in done.stderr


def test_a_gzip_compressed_trace_imports_as_its_text_does(tmp_path):
    """Long recordings are kept compressed (tests/data/*.jsonl.gz): read as they are, found by
    their magic bytes whatever the file is called."""
    plain, packed = tmp_path / "t.jsonl", tmp_path / "t.jsonl.gz"
    plain.write_text(GOOD * 7)
    packed.write_bytes(gzip.compress((GOOD * 7).encode()))
    assert _import(tmp_path / "a.db", plain).returncode == 0
    done = _import(tmp_path / "b.db", packed)
    assert done.returncode == 0, done.stderr
    assert _rows(tmp_path / "a.db") == _rows(tmp_path / "b.db") == 7


def test_several_files_are_one_transaction(tmp_path):
    """The second file fails at the database (a trigger refuses its rows): the first file's
    rows are not kept either."""
    db = tmp_path / "vs.db"
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text(GOOD * 100)
    second.write_text(GOOD.replace("torch", "boom") * 5)
    assert _import(db, first).returncode == 0  # creates the schema; 100 rows
    with sqlite3.connect(db) as c:
        c.execute("CREATE TRIGGER refuse BEFORE INSERT ON samples WHEN NEW.source = 'boom' "
                  "BEGIN SELECT RAISE(ABORT, 'boom is refused'); END")
    done = _import(db, first, second)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "boom is refused" in done.stderr
    assert _rows(db) == 100  # only the first, separate import


def test_several_files_where_the_last_has_a_bad_line_write_nothing(tmp_path):
    """All or nothing, as documented: three files, a bad line deep in the last (12,001 good
    lines before it, more than one chunk of 5,000): no row of any file is kept, and the error
    names the file and line."""
    db = tmp_path / "vs.db"
    files = [tmp_path / f"{name}.jsonl" for name in "abc"]
    files[0].write_text(GOOD * 7_000)
    files[1].write_text(GOOD * 3)
    files[2].write_text(GOOD * 12_001 + '{"ts": 1e12, "allocated_bytes": 1}\n' + GOOD)
    done = _import(db, *files)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert (f"{files[2]}:12002: 'ts' must be Unix seconds from 0 (1970) to 253402300799 "
            "(9999-12-31), got 1000000000000.0") in done.stderr
    assert _rows(db) == 0


_PEAK = ("import resource, sys; from vramscope.agent.cli import main; rc = main(sys.argv[1:]); "
         "print('PEAK_KIB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(rc)")


def _peak_kib(db: Path, trace: Path) -> int:
    done = subprocess.run([sys.executable, "-c", _PEAK, "import", str(trace), "--db",
                           f"sqlite:///{db}"], capture_output=True, text=True, timeout=300,
                          cwd=str(REPO_ROOT))
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split("PEAK_KIB")[1])


def _big_trace(path: Path, lines: int) -> Path:
    line = json.dumps({"ts": 1.7e9, "device": 0, "phase": "decode", "source": "torch",
                       "allocated_bytes": 123456789, "reserved_bytes": 223456789}) + "\n"
    with open(path, "w") as fh:
        for _ in range(lines // 10_000):
            fh.write(line * 10_000)
    return path


@pytest.mark.parametrize("lines", [40_000, pytest.param(1_500_000, marks=pytest.mark.slow)])
def test_a_large_trace_is_streamed(tmp_path, lines):
    """The import's peak memory does not grow with the file: a trace of ``lines`` records
    (1.5 M: a 200 MB file) peaks within 20 MiB of a 10,000-line one (holding them all takes
    ~1 KB a record)."""
    small = _peak_kib(tmp_path / "small.db", _big_trace(tmp_path / "small.jsonl", 10_000))
    big = _peak_kib(tmp_path / "big.db", _big_trace(tmp_path / "big.jsonl", lines))
    print(f"import peak RSS: {small // 1024} MiB (10,000 lines) -> {big // 1024} MiB ({lines:,})")
    assert big - small < 20 * 1024, f"{small // 1024} MiB -> {big // 1024} MiB"
    assert _rows(tmp_path / "big.db") == lines
