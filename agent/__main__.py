from vramscope.agent.cli import entry

entry()
