"""The simulated model's shape and the sizes of the tensors it allocates.

Sizes follow a Llama-style decoder (the same formulas as :mod:`vramscope.agent.estimate`): the
weights
as one tensor per projection, the KV cache per token, and the temporaries of one prefill
chunk or one decode step (hidden states, q/k/v, the gated MLP's two intermediate tensors and
fp32 logits for the last position of each sequence).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SimModel:
    name: str = "llama-3-8b-shaped"
    num_layers: int = 32
    hidden: int = 4096
    intermediate: int = 14336
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab: int = 128256
    dtype_bytes: int = 2
    dtype: str = "bfloat16"

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def weight_tensors(self) -> list[int]:
        """One size per parameter tensor, in load order."""
        b, h = self.dtype_bytes, self.hidden
        q = h * self.num_heads * self.head_dim * b
        kv = h * self.num_kv_heads * self.head_dim * b
        mlp = h * self.intermediate * b
        layer = [h * b, q, kv, kv, q, h * b, mlp, mlp, mlp]  # norm, q k v o, norm, gate up down
        return [self.vocab * h * b] + layer * self.num_layers + [h * b, self.vocab * h * b]

    @property
    def weights_bytes(self) -> int:
        return sum(self.weight_tensors())

    def prefill_temporaries(self, tokens: int, sequences: int) -> list[int]:
        """The tensors live at the peak of one layer of a prefill over ``tokens`` tokens."""
        b = self.dtype_bytes
        qkv = tokens * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim * b
        return [tokens * self.hidden * b, tokens * self.hidden * b, qkv,
                tokens * self.intermediate * b, tokens * self.intermediate * b,
                sequences * self.vocab * 4]

    def decode_temporaries(self, batch: int) -> list[int]:
        """The tensors of one decode step over ``batch`` sequences (many are small-pool)."""
        return self.prefill_temporaries(batch, batch)
