"""Simulated inference servers for ``vramscope demo`` (and the allocator benchmark).

``caching_allocator`` (PyTorch's CUDA caching allocator as bookkeeping), ``workload`` (bursty
request traces), ``model`` (tensor sizes of a Llama-shaped model), ``server`` (a
continuous-batching server over them), ``scenarios``, ``demo`` (the demo's orchestration) and
``gpu_demo`` (CUDA only). The first-fit pool and the check against a real GPU are tooling, in
``tools/sim/`` of the source checkout.
"""
