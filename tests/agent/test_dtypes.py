"""One dtype table (vramscope.agent.dtypes) behind the KV pool and the estimator."""

from __future__ import annotations

import pytest
from vramscope.agent import estimate
from vramscope.agent.dtypes import DTYPE_BYTES, element_bytes
from vramscope.agent.errors import UsageError
from vramscope.hooks.kvpool_types import KVPoolError, dtype_name_and_bytes


@pytest.mark.parametrize("name", ["bf16", "torch.float8_e5m2", "FP16", "double", "uint8"])
def test_the_pool_and_the_estimator_read_the_same_sizes(name):
    assert dtype_name_and_bytes(name)[1] == estimate.dtype_bytes(name) == element_bytes(name)


def test_both_name_every_known_dtype_when_one_is_unknown():
    known = ", ".join(sorted(DTYPE_BYTES))
    with pytest.raises(KVPoolError, match=f"unknown dtype 'bfloat15'; known: {known}$"):
        dtype_name_and_bytes("bfloat15")
    with pytest.raises(UsageError, match=f"unknown dtype 'bfloat15'; known: {known}$"):
        estimate.dtype_bytes("bfloat15")


def test_a_packed_4_bit_dtype_sizes_weights_but_not_a_kv_pool():
    assert estimate.dtype_bytes("int4") == 0.5
    with pytest.raises(KVPoolError, match="'int4' packs 0.5 bytes per element; a KV pool needs"):
        dtype_name_and_bytes("int4")
