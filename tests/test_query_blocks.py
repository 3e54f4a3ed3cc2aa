"""The blocked-attention iterator (issue 38 part 8): sinklab.attention_masks.query_blocks, against the mask itself."""

from __future__ import annotations

import pytest
import torch

from sinklab.attention_masks import MaskSpec, build_mask, query_blocks
from sinklab.errors import InputError

SPECS = [MaskSpec(), MaskSpec(prefix_len=5), MaskSpec(window=4), MaskSpec(prefix_len=3, window=6),
         MaskSpec(causal=False), MaskSpec(causal=False, window=3)]


@pytest.mark.parametrize("spec", SPECS, ids=repr)
@pytest.mark.parametrize("t_q,t_k,block", [(17, 17, 4), (17, 17, 1), (17, 17, 100), (5, 17, 2)])
def test_blocks_cover_every_visible_key_in_order(spec, t_q, t_k, block):
    """Query blocks partition [0, t_q) in order, none longer than ``block``; every key a row of a block sees
    (read off build_mask, the mask's own definition) lies in the block's key range; for causal attention
    without a prefix the range is tight (its first and last keys are seen by some row)."""
    offset = t_k - t_q  # fewer queries than keys: the queries are the last t_q positions
    full = build_mask(t_k, t_k, spec)[offset:]  # (t_q, t_k) bool
    blocks = list(query_blocks(t_q, block, spec, t_k=t_k, offset=offset))
    assert [b[0] for b in blocks] == list(range(0, t_q, block))
    assert all(q1 - q0 <= block and q1 > q0 for q0, q1, _, _ in blocks) and blocks[-1][1] == t_q
    for q0, q1, k0, k1 in blocks:
        seen = full[q0:q1].any(dim=0).nonzero().flatten()
        assert seen.numel() > 0
        assert k0 <= int(seen[0]) and int(seen[-1]) < k1 <= t_k
        if spec.causal and spec.prefix_len <= 1:
            assert (k0, k1) == (int(seen[0]), int(seen[-1]) + 1)


def test_a_keys_function_replaces_the_spec():
    calls = []

    def keys(a, b):
        calls.append((a, b))
        return 0, 2 * b

    assert list(query_blocks(5, 2, keys=keys)) == [(0, 2, 0, 4), (2, 4, 0, 8), (4, 5, 0, 10)]
    assert calls == [(0, 2), (2, 4), (4, 5)]


def test_block_below_one_is_refused():
    with pytest.raises(InputError, match="at least 1"):
        list(query_blocks(4, 0))
