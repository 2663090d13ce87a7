"""Code that runs inside the inference server. Never raises into it, never blocks it.

Kept empty on purpose; the public API is re-exported by the ``vramscope`` facade module.
"""
