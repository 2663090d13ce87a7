"""The first hour of a new user, as a script: the README's demo, then `analyze`, `import`,
`estimate`, `config check` and `status` on good and bad inputs, each command printed with its
output and exit status.

    .venv/bin/python -m tests.walkthrough                  # print the transcript
    .venv/bin/python -m tests.walkthrough --update-readme  # write it into README.md

It runs the `vramscope` installed beside this Python (the .venv's), in a fresh home folder
(HOME, the data and runtime folders, the working folder: no config file, no agent, no database
of the machine is seen), on copies of traces committed under tests/data. The transcript is
normalised so that two runs print the same text: the home folder reads `/home/you`, the demo's
port `<port>`, times and ages that depend on the clock `<time>` and `<age>`, the database's size
and the demo's counts `<n>`, and the demo's progress and alert lines (how far the simulation gets
in 20 s depends on the machine) are left out.
tests/test_walkthrough.py checks that README.md's "What you will see" section is this text.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
README = ROOT / "README.md"
HOME_SHOWN = "/home/you"
BEGIN = "<!-- walkthrough:begin (generated: python -m tests.walkthrough --update-readme) -->"
END = "<!-- walkthrough:end -->"

GOOD_CONFIG = """\
[dashboard]
port = 8400

[alerts]
headroom_warning_ratio = 0.05
"""
# A typo'd key, uids that are not numbers, and a warning threshold below its critical one.
BAD_CONFIG = """\
[agent]
allowed_uids = "1,abc,-5"

[dashboard]
prot = 8400

[alerts]
headroom_warning_ratio = 0.01
headroom_critical_ratio = 0.02
"""
TRUNCATED_BYTES = 40_000


@dataclass(frozen=True)
class Step:
    args: tuple[str, ...]
    note: str = ""          # a comment line printed before the command


STEPS = (
    Step(("status",), "a fresh machine: no agent, no database yet"),
    Step(("demo", "--duration", "20", "--no-browser", "--port", "0"),
         "the README's first command, stopped after 20 s"),
    Step(("analyze", "gpu_oom.jsonl"),
         "a recording from a real GPU (tests/data/gpu_oom.jsonl): a fragmenting server's OOM"),
    Step(("analyze", "empty.jsonl"), "an empty file"),
    Step(("analyze", "truncated.jsonl.gz"),
         f"the first {TRUNCATED_BYTES:,} bytes of tests/data/gpu_pair_leak.jsonl.gz "
         "(a killed recorder)"),
    Step(("analyze", "--skip-invalid", "truncated.jsonl.gz")),
    Step(("import", "gpu_oom.jsonl")),
    Step(("import", "bad.jsonl"),
         "two good lines, a time that is not a number, a negative byte count, "
         "a line that is not JSON"),
    Step(("import", "--skip-invalid", "bad.jsonl")),
    Step(("estimate", "--model", "llama-3-8b")),
    Step(("estimate", "--model", "llama-3.1-70b", "--tensor-parallel", "4", "--context", "8192",
          "--concurrency", "16"), "a 70B model split across four GPUs: one GPU's share"),
    Step(("estimate", "--params", "8B"), "a parameter count but no shape"),
    Step(("estimate", "--model", "llama3-8b"), "a misspelt model"),
    Step(("config", "check", "good.toml")),
    Step(("config", "check", "bad.toml"),
         "a typo'd key, uids that are not numbers, a warning threshold below the critical one"),
    Step(("status",), "no agent runs: what the database (written by import above) knows"),
)


def make_inputs(home: Path) -> None:
    """The files the steps read, in the home folder (so the transcript shows short names)."""
    shutil.copy(DATA / "gpu_oom.jsonl", home / "gpu_oom.jsonl")
    (home / "empty.jsonl").write_bytes(b"")
    (home / "truncated.jsonl.gz").write_bytes(
        (DATA / "gpu_pair_leak.jsonl.gz").read_bytes()[:TRUNCATED_BYTES])
    good = (DATA / "gpu_oom.jsonl").read_text().splitlines()[:2]
    bad = ['{"ts": "yesterday", "device": 0}',
           '{"ts": 1795970060.0, "device": 0, "allocated_bytes": -5}',
           "not json"]
    (home / "bad.jsonl").write_text("\n".join(good + bad) + "\n")
    (home / "good.toml").write_text(GOOD_CONFIG)
    (home / "bad.toml").write_text(BAD_CONFIG)
    (home / "run").mkdir()


def vramscope_command() -> list[str]:
    """The command installed beside this interpreter (the .venv's), else ``python -m``."""
    exe = Path(sys.executable).with_name("vramscope")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "vramscope"]


def clean_env(home: Path) -> dict[str, str]:
    """This machine's environment without anything that would find its config, data or agent."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VRAMSCOPE_", "XDG_")) and k not in {"COLUMNS", "LINES"}}
    env.update(HOME=str(home), XDG_RUNTIME_DIR=str(home / "run"), PYTHONUNBUFFERED="1",
               COLUMNS="100", TZ="UTC")
    return env


# Lines the demo prints whose presence or figures depend on the machine's speed.
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (\S+) (\w+) (.*)$")
_ISO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
_AGE = re.compile(r"\b[\d.]+ (s|min|h|days) ago\b")
_DB_SIZE = re.compile(r"^(database: \S+, )[\d.]+ MiB$")
_PORT = re.compile(r"(http://127\.0\.0\.1:)\d+/")
# The demo's own socket folder (tempfile.mkdtemp): a fresh name every run.
_DEMO_FOLDER = re.compile(r"\S*/vramscope-demo-[^/\s]+/")
_PROGRESS_LEFT_OUT = ("  [a progress line every 5 s and a log line per alert fired or resolved, "
                      "left out: how far 20 s of simulation gets depends on the machine]")
_ALERTS_LEFT_OUT = "  [a line per alert: which have fired and resolved by the end varies]"


def normalise_demo(lines: list[str]) -> list[str]:
    """The demo's lines that every run prints, with its counts and times masked."""
    out: list[str] = []
    for line in lines:
        log = _LOG_LINE.match(line)
        if log:
            if log.group(3).startswith("agent started"):
                out.append(_DEMO_FOLDER.sub("/tmp/vramscope-demo-<random>/",
                                            f"<time> {log.group(1)} {log.group(2)} "
                                            f"{log.group(3)}"))
            continue  # alert log lines and the final row count vary with the machine's speed
        if line.startswith("sim ") or "behind real time" in line:
            if _PROGRESS_LEFT_OUT not in out:
                out.append(_PROGRESS_LEFT_OUT)
            continue
        if line.startswith("  alert "):
            if not out or out[-1] != _ALERTS_LEFT_OUT:
                out.append(_ALERTS_LEFT_OUT)
            continue
        if line.startswith("  device ") or "post-mortem(s)" in line:
            line = re.sub(r"\d+ (requests|aborted|OOM|alert)", r"<n> \1", line)
        out.append(_DEMO_FOLDER.sub("/tmp/vramscope-demo-<random>/",
                                    _PORT.sub(r"\g<1><port>/", line)))
    return out


def normalise(text: str, home: Path, demo: bool) -> str:
    text = text.replace(str(home), HOME_SHOWN)
    host = socket.gethostname()
    lines = text.splitlines()
    if demo:
        lines = normalise_demo(lines)
        lines = [_ISO_TIME.sub("<time>", line) for line in lines]
    lines = [_AGE.sub("<age> ago", line) for line in lines]
    # The database's size moves with every schema change, not with anything a user does.
    lines = [_DB_SIZE.sub(r"\1<n> MiB", line) for line in lines]
    # The status names processes by host; the host is this machine's.
    lines = [re.sub(rf"\b{re.escape(host)} GPU\b", "<host> GPU", line) for line in lines]
    return "\n".join(line.rstrip() for line in lines)


def run_step(step: Step, home: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(vramscope_command() + list(step.args), cwd=home, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300, check=False)
    head = (f"# {step.note}\n" if step.note else "") + "$ vramscope " + " ".join(step.args)
    body = normalise(proc.stdout, home, demo=step.args[0] == "demo")
    return f"{head}\n{body}\n[exit {proc.returncode}]".replace("\n\n[exit", "\n[exit")


def transcript() -> str:
    """Run every step in a fresh home folder; the normalised transcript."""
    with tempfile.TemporaryDirectory(prefix="vramscope-walkthrough-") as tmp:
        home = Path(tmp).resolve()
        make_inputs(home)
        env = clean_env(home)
        return "\n\n".join(run_step(step, home, env) for step in STEPS) + "\n"


def readme_section(readme: str) -> str:
    """The transcript as README.md holds it (between the markers, inside a text block)."""
    try:
        start = readme.index(BEGIN) + len(BEGIN)
        end = readme.index(END, start)
    except ValueError:
        raise ValueError(f"README.md has no walkthrough section ({BEGIN} ... {END})") from None
    body = readme[start:end].strip("\n")
    fence = "```text\n"
    if not body.startswith(fence) or not body.endswith("```"):
        raise ValueError("README.md's walkthrough section is not one ```text block")
    return body[len(fence):-3]


def with_section(readme: str, text: str) -> str:
    start = readme.index(BEGIN) + len(BEGIN)
    end = readme.index(END, start)
    return readme[:start] + "\n```text\n" + text + "```\n" + readme[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.walkthrough", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--update-readme", action="store_true",
                        help="write the transcript into README.md's walkthrough section")
    args = parser.parse_args(argv)
    text = transcript()
    if args.update_readme:
        README.write_text(with_section(README.read_text(), text))
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
