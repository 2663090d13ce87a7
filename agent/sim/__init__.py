"""Simulated inference servers for ``vramscope demo`` and the allocator benchmark.

``caching_allocator`` (PyTorch's CUDA caching allocator as bookkeeping), ``first_fit`` (the
pre-paging variable-size pool), ``workload`` (bursty request traces), ``model`` (tensor sizes of
a Llama-shaped model), ``server`` (a continuous-batching server over them), ``scenarios``,
``demo`` (the demo's orchestration) and ``gpu_demo`` / ``gpu_check`` (CUDA only).
"""
