"""``python -m vramscope``: the same CLI as the ``vramscope`` command."""

from vramscope.agent.cli import entry

entry()
