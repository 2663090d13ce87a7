"""Simulator parts outside the product: ``first_fit`` (the pre-paging variable-size pool, one of
``bench allocators``' three designs) and ``gpu_check`` (the caching-allocator model against
PyTorch's allocator on a CUDA device). The demo's simulator is ``vramscope.agent.sim``.
"""
