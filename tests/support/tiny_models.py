"""Tiny random-weight models built from a config (no hub, no download), shared by CPU tests."""

from __future__ import annotations


def tiny_llama():
    """A 2-layer Llama with 4 heads and 2 KV heads (GQA), seeded, in eval mode, on the CPU."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256)
    return LlamaForCausalLM(config).eval()
