"""vramscope's sidecar side: records, config, store, analysis, alerts and the CLI.

Kept empty on purpose: the in-server hooks import ``vramscope.agent.records`` and must not pay for
anything else.
"""
