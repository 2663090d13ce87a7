"""The token chain that keys a KV pool's full blocks for prefix reuse, and a live request's table.

A full block's prefix key is ``(hash of the parent block's key, its tokens)``: two prompts
share a block only when every token before it is the same. :func:`leading_keys` walks a new
prompt's keys (never the block holding its last token: the engine always computes that one);
:meth:`Request.newly_full_keys` keys a live request's blocks as they fill. The pool
(``kvpool.py``) decides what a key finds; this module only says what the keys are.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

# A full block's prefix key: (hash of the parent block's key, its tokens).
Key = tuple[int | None, tuple[int, ...]]


def leading_keys(token_ids: Sequence[int], num_tokens: int, block_size: int) -> Iterator[Key]:
    """The keys of a prompt's full blocks, first to last, short of the last token's block;
    each key's hash is taken only when the caller asks for the next one."""
    parent: int | None = None
    for i in range((num_tokens - 1) // block_size):
        key = (parent, tuple(token_ids[i * block_size:(i + 1) * block_size]))
        yield key
        parent = hash(key)


class Request:
    """One live request's block table and, when token ids were given, its token chain."""

    __slots__ = ("blocks", "num_tokens", "tokens", "hashed", "last_hash")

    def __init__(self, blocks: list[int], num_tokens: int, tokens: list[int] | None) -> None:
        self.blocks = blocks
        self.num_tokens = num_tokens
        self.tokens = tokens  # None: no chain to key blocks by
        self.hashed = 0  # leading blocks whose prefix key is known
        self.last_hash: int | None = None  # hash of the last keyed block's key

    def newly_full_keys(self, block_size: int) -> Iterator[tuple[int, Key]]:
        """``(block index, key)`` of each block that filled since the last call, in order
        (none without a token chain); read them all: each is counted known once yielded."""
        tokens = self.tokens
        if tokens is None:
            return
        full = min(len(tokens) // block_size, len(self.blocks))
        while self.hashed < full:
            i = self.hashed
            key = (self.last_hash, tuple(tokens[i * block_size:(i + 1) * block_size]))
            yield i, key
            self.last_hash = hash(key)
            self.hashed += 1
