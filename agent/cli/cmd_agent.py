"""``vramscope agent [--config PATH] [--db URL] [--socket PATH]``: the sidecar process."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Literal

from vramscope.agent.cli.common import checked_config, url_or_path

if TYPE_CHECKING:
    from vramscope.agent.sources.nvml import DeviceSource


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _add_arguments(sub.add_parser(
        "agent", help="run the sidecar agent (NVML sampling, ingest socket, writer)",
        description="Sample every visible GPU through NVML, accept records from the in-server "
                    "hooks on a Unix socket, and write them all to the database. Stops with a "
                    "final flush on SIGTERM/SIGINT."))


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="config file (default: the documented search order)")
    p.add_argument("--db", dest="db_url", type=url_or_path,
                   help="database URL or SQLite file path (overrides database.url)")
    p.add_argument("--socket", dest="socket_path", help="socket path (overrides "
                                                        "agent.socket_path)")
    p.add_argument("--no-nvml", action="store_true", help="do not sample GPUs (ingest only)")
    p.add_argument("--no-alerts", action="store_true",
                   help="do not evaluate alert rules live (benchmarks: the engine's share)")
    p.add_argument("--fake-devices", type=int, default=0, metavar="N",
                   help="sample N simulated devices instead of NVML (tests, benchmarks)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vramscope.agent.daemon import Agent
    from vramscope.agent.errors import UsageError

    # the one validator `vramscope config check` runs: every problem at once, before starting
    config = checked_config(args.config).config.replace(database__url=args.db_url,
                                                        agent__socket_path=args.socket_path)
    if args.fake_devices < 0:
        raise UsageError(f"--fake-devices must be >= 0, got {args.fake_devices}")
    source: DeviceSource | Literal["nvml"] | None = "nvml"
    if args.no_nvml:
        source = None
    elif args.fake_devices:
        from vramscope.agent.sources.nvml import FakeNvmlSource

        source = FakeNvmlSource(args.fake_devices)
    Agent(config, source=source, alerts=not args.no_alerts).run_forever()
    return 0


def main(argv: list[str] | None = None) -> int:
    """The agent alone, without the other subcommands' imports (used by ``AgentProcess``, so a
    machine with only the agent's dependencies can run it)."""
    import logging
    import sys

    from vramscope.agent.errors import VramscopeError

    parser = argparse.ArgumentParser(prog="vramscope agent")
    _add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return run(args)
    except VramscopeError as exc:
        for problem in getattr(exc, "problems", None) or [str(exc)]:
            print(f"vramscope: error: {problem}", file=sys.stderr)
        return exc.exit_code
