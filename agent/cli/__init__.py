"""The ``vramscope`` command: one argparse parser, one module per subcommand.

Each subcommand lives in ``agent/cli/cmd_<name>.py`` and exposes ``register(subparsers)``, which
adds its parser and sets ``func=run(args) -> int``. Modules import their heavy dependencies
inside ``run`` so ``vramscope --help`` stays fast and the sidecar never imports torch.

User errors are :class:`vramscope.agent.errors.VramscopeError` subclasses, printed once here with
their exit code (2 for usage, 1 for failures) and never as a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

from vramscope.agent.errors import VramscopeError

# Order is the order in ``--help``; each name is a module ``cmd_<name>`` beside this one.
COMMANDS: tuple[str, ...] = (
    "demo", "agent", "dashboard", "status", "analyze", "import", "export", "replay",
    "estimate", "bench", "config", "db",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's default exits 2 too; its wording
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vramscope", description="GPU memory observability for LLM inference.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f"vramscope.agent.cli.cmd_{name}").register(sub)
    return parser


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("vramscope")
    except Exception:  # not installed (running from a checkout)
        return "0+unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    logging.getLogger("alembic").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except VramscopeError as exc:
        for problem in getattr(exc, "problems", None) or [str(exc)]:  # a config's: each
            print(f"vramscope: error: {problem}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `vramscope export | head`
        return 0


def entry() -> None:
    sys.exit(main())
