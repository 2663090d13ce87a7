"""User-facing error types, rendered once at the CLI edge (as in ``click/exceptions.py``).

Code below the CLI raises these with a message that names what is wrong and where; the CLI
prints ``vramscope: error: <message>`` and exits with ``exit_code``. No traceback reaches a user
for an error of theirs.
"""

from __future__ import annotations


class VramscopeError(Exception):
    """A failure the user can act on. Exit code 1."""

    exit_code = 1


class UsageError(VramscopeError):
    """The command line itself is wrong. Exit code 2."""

    exit_code = 2


class ConfigError(VramscopeError):
    """A config file or override is bad: names the file, the key and the bad value.
    ``problems``: each one when there are several (the message holds them a line each)."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or [message]


class TraceError(VramscopeError):
    """A trace file is malformed: ``FILE:LINE: what is wrong``."""

    def __init__(self, path: str, line: int, problem: str) -> None:
        super().__init__(f"{path}:{line}: {problem}")
        self.path = path
        self.line = line
        self.problem = problem


class StoreError(VramscopeError):
    """The database cannot be opened, upgraded or written."""
