"""The blocked-attention driver (issue 38 part 8): sinklab.attention_masks.reduce_tiles with its per-tile reducers
(TileReducer, Reducers), against hand-worked walks, build_mask and a float64 full-matrix computation."""

from __future__ import annotations

import pytest
import torch

from sinklab.attention_masks import MaskSpec, Reducers, TileReducer, build_mask, query_blocks, reduce_tiles
from sinklab.errors import InputError


class Walk(TileReducer):
    """Records what the driver hands it: ("tile", q0, q1, k0, k1) and ("empty", q0, q1), in order."""

    def __init__(self, log: list | None = None, name: str = "") -> None:
        self.log = [] if log is None else log
        self.name = name

    def tile(self, q0, q1, k0, k1):
        self.log.append((self.name, "tile", q0, q1, k0, k1) if self.name else ("tile", q0, q1, k0, k1))

    def empty(self, q0, q1):
        self.log.append((self.name, "empty", q0, q1) if self.name else ("empty", q0, q1))

    def result(self):
        return self.log


# six queries, blocks of two (0-based rows, end exclusive); keys worked out by hand from the mask's definition
HAND = [
    # causal: block [q0, q1) sees keys [0, q1)
    (MaskSpec(), 6, [("tile", 0, 2, 0, 2), ("tile", 2, 4, 0, 4), ("tile", 4, 6, 0, 6)]),
    # window 2: query i sees i-1, i: block [q0, q1) sees [q0 - 1, q1)
    (MaskSpec(window=2), 6, [("tile", 0, 2, 0, 2), ("tile", 2, 4, 1, 4), ("tile", 4, 6, 3, 6)]),
    # prefix 3: keys 0, 1, 2 seen by every query, so the first block's range reaches key 2
    (MaskSpec(prefix_len=3), 6, [("tile", 0, 2, 0, 3), ("tile", 2, 4, 0, 4), ("tile", 4, 6, 0, 6)]),
    # prefix 3 and window 2 (the window wins for late queries): [max(0, q0 - 1), max(q1, 3))
    (MaskSpec(prefix_len=3, window=2), 6, [("tile", 0, 2, 0, 3), ("tile", 2, 4, 1, 4), ("tile", 4, 6, 3, 6)]),
    # bidirectional window 2: [q0 - 1, q1 + 1) clipped to the 6 keys
    (MaskSpec(causal=False, window=2), 6, [("tile", 0, 2, 0, 3), ("tile", 2, 4, 1, 5), ("tile", 4, 6, 3, 6)]),
    # the last block is short: 5 queries in blocks of 2
    (MaskSpec(), 5, [("tile", 0, 2, 0, 2), ("tile", 2, 4, 0, 4), ("tile", 4, 5, 0, 5)]),
]


@pytest.mark.parametrize("spec,t,want", HAND, ids=lambda x: repr(x) if isinstance(x, MaskSpec) else "")
def test_hand_worked_walks(spec, t, want):
    got = reduce_tiles(Walk(), t, 2, spec)
    assert got == want
    # the same tiles as the iterator, and every key a row sees (build_mask) lies in its block's range,
    # no key outside the range is seen by every row of a causal block without a prefix
    assert [w[1:] for w in want] == list(query_blocks(t, 2, spec))
    full = build_mask(t, t, spec)
    for _, q0, q1, k0, k1 in want:
        seen = full[q0:q1].any(dim=0).nonzero().flatten().tolist()
        assert seen and k0 <= seen[0] and seen[-1] < k1
        assert not full[q0:q1, :k0].any() and not full[q0:q1, k1:].any()


def test_fewer_queries_than_keys_walk_the_last_positions():
    """3 queries over 7 keys (offset 4: rows 0, 1, 2 are positions 4, 5, 6), blocks of 2, window 3."""
    got = reduce_tiles(Walk(), 3, 2, MaskSpec(window=3), t_k=7, offset=4)
    assert got == [("tile", 0, 2, 2, 6), ("tile", 2, 3, 4, 7)]


def test_empty_key_ranges_go_to_empty():
    """A padding mask (keys read off it) under which rows 2..3 see no key: that block goes to ``empty``, the
    others to ``tile`` with the range of the keys their rows see."""
    m = torch.zeros(6, 6, dtype=torch.bool)
    m[0, 1] = m[1, 0] = True  # rows 0, 1 see keys 0..1
    m[4, 5] = True  # row 4 sees key 5, row 5 nothing

    def keys(q0, q1):
        cols = m[q0:q1].any(dim=0).nonzero().flatten()
        return (0, 0) if cols.numel() == 0 else (int(cols[0]), int(cols[-1]) + 1)

    assert reduce_tiles(Walk(), 6, 2, keys=keys) == [("tile", 0, 2, 0, 2), ("empty", 2, 4), ("tile", 4, 6, 5, 6)]


def test_the_default_reducer_ignores_empty_blocks_and_returns_none():
    class Count(TileReducer):
        n = 0

        def tile(self, q0, q1, k0, k1):
            self.n += 1

    r = Count()
    assert reduce_tiles(r, 6, 2, keys=lambda a, b: (0, 0) if a == 2 else (0, b)) is None
    assert r.n == 2
    with pytest.raises(NotImplementedError):
        reduce_tiles(TileReducer(), 2, 2)


def test_block_below_one_is_refused():
    with pytest.raises(InputError, match="at least 1"):
        reduce_tiles(Walk(), 4, 0)


class SoftmaxSums(TileReducer):
    """Row sums and column sums of softmax attention ``A = softmax(scale q k^T + mask)``, tile by tile (a block's key
    range holds every key its rows see, so each tile's rows are whole softmax rows) in float32."""

    def __init__(self, q, k, spec, offset):
        self.q, self.k, self.spec, self.offset = q, k, spec, offset
        self.rows = torch.zeros(q.shape[0])
        self.cols = torch.zeros(k.shape[0])

    def tile(self, q0, q1, k0, k1):
        s = self.q[q0:q1] @ self.k[k0:k1].T * self.q.shape[1] ** -0.5  # (n, span)
        seen = build_mask(self.k.shape[0], self.k.shape[0], self.spec)[self.offset + q0:self.offset + q1, k0:k1]
        a = torch.softmax(s.masked_fill(~seen, float("-inf")), dim=-1)
        self.rows[q0:q1] += a.sum(dim=-1)
        self.cols[k0:k1] += a.sum(dim=0)

    def result(self):
        return self.rows, self.cols


@pytest.mark.parametrize("spec", [MaskSpec(), MaskSpec(window=3), MaskSpec(prefix_len=4),
                                  MaskSpec(prefix_len=2, window=4), MaskSpec(causal=False, window=2)], ids=repr)
@pytest.mark.parametrize("t_q,t_k,block", [(11, 11, 3), (11, 11, 1), (5, 11, 2)])
def test_a_custom_reducer_against_the_full_matrix(spec, t_q, t_k, block):
    """Softmax row sums (1 for every row) and column sums reduced tile by tile equal the float64 full T x T
    computation (masked softmax over all keys, summed)."""
    g = torch.Generator().manual_seed(7)
    q, k = torch.randn(t_q, 8, generator=g), torch.randn(t_k, 8, generator=g)
    offset = t_k - t_q
    rows, cols = reduce_tiles(SoftmaxSums(q, k, spec, offset), t_q, block, spec, t_k=t_k, offset=offset)
    seen = build_mask(t_q, t_k, spec)
    full = (q.double() @ k.double().T * 8 ** -0.5).masked_fill(~seen, float("-inf")).softmax(dim=-1)
    assert (rows.double() - 1).abs().max().item() <= 1e-6
    assert (cols.double() - full.sum(dim=0)).abs().max().item() <= 1e-5
    assert cols.sum().item() == pytest.approx(t_q, abs=1e-4)


def test_two_reducers_share_one_walk():
    """A tuple of reducers, a list and Reducers give each tile to each reducer in order (a before b, tile by tile),
    once; the result is the tuple of their results."""
    keys = lambda a, b: (0, 0) if a == 2 else (max(0, a - 1), b)  # noqa: E731 (block [2, 4) sees nothing)
    for make in (lambda a, b: (a, b), lambda a, b: [a, b], lambda a, b: Reducers(a, b)):
        log = []
        a, b = Walk(log, "a"), Walk(log, "b")
        res = reduce_tiles(make(a, b), 6, 2, keys=keys)
        assert res == (log, log)
        assert log == [("a", "tile", 0, 2, 0, 2), ("b", "tile", 0, 2, 0, 2),
                       ("a", "empty", 2, 4), ("b", "empty", 2, 4),
                       ("a", "tile", 4, 6, 3, 6), ("b", "tile", 4, 6, 3, 6)]

    # two real reducers at once equal each one alone
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(9, 4, generator=g), torch.randn(9, 4, generator=g)
    spec = MaskSpec(window=4)
    both = reduce_tiles((SoftmaxSums(q, k, spec, 0), Walk()), 9, 4, spec)
    alone = reduce_tiles(SoftmaxSums(q, k, spec, 0), 9, 4, spec)
    assert torch.equal(both[0][0], alone[0]) and torch.equal(both[0][1], alone[1])
    assert both[1] == [("tile", 0, 4, 0, 4), ("tile", 4, 8, 1, 8), ("tile", 8, 9, 5, 9)]


def test_a_chunk_that_sees_no_key_attends_its_virtual_key_only():
    """The model's chunked reducer: a chunk without a real key still attends the virtual key (softmax with a sink
    token: weight 1 on it, the output is its value); the tile path's output reducer (sigmoid attention) gives such
    rows zeros."""
    from sinklab.nn.attention import _ChunkOutput, _TileOutput, tile_forward
    from sinklab.nn.ops import ATTENTION, OpContext
    from sinklab.nn.positional import NoPE

    B, H, T, dh = 1, 2, 4, 3
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, dh, generator=g) for _ in range(3))
    vk, vv = torch.randn(1, H, 1, dh, generator=g), torch.randn(1, H, 1, dh, generator=g)
    op = ATTENTION.get("softmax")(OpContext(n_heads=H, n_kv_heads=H, head_dim=dh, d_model=H * dh, max_seq_len=T))
    chunks = _ChunkOutput(q, k, v, op, dh ** -0.5, MaskSpec(), NoPE(None), None, vk, vv, None, use_ckpt=False)
    out = reduce_tiles(chunks, T, 2, keys=lambda a, b: (0, 0))
    assert (out - vv.expand(B, H, T, dh)).abs().max().item() <= 1e-6
    sig = ATTENTION.get("sigmoid")(OpContext(n_heads=H, n_kv_heads=H, head_dim=dh, d_model=H * dh, max_seq_len=T))
    tiles = _TileOutput(tile_forward, q, k, v, sig, dh ** -0.5, MaskSpec(), NoPE(None), None)
    assert torch.equal(reduce_tiles(tiles, T, 2, keys=lambda a, b: (0, 0) if a == 0 else (0, b))[:, :, :2],
                       torch.zeros(B, H, 2, dh))


def test_the_chunked_paths_reducer_is_freed_after_a_forward_without_backward(monkeypatch):
    """A grad-enabled forward on the chunked path (checkpointed chunks) that is thrown away without a backward
    frees its reducer and the chunks' outputs: the checkpointed function holds the layer's settings, not the reducer
    (a bound method kept it, and every chunk's output, alive for good)."""
    import gc
    import weakref

    from sinklab.nn import ModelConfig, SinkLM
    from sinklab.nn import attention as A
    from sinklab.nn.attention import paths_taken

    refs = []
    init = A._ChunkOutput.__init__

    def spy(self, *a, **k):
        init(self, *a, **k)
        refs.append(weakref.ref(self))

    monkeypatch.setattr(A._ChunkOutput, "__init__", spy)
    torch.manual_seed(0)
    model = SinkLM(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=48, max_seq_len=16,
                               positional="t5"))  # a learned bias trains on the chunked path
    x = torch.randint(0, 64, (2, 16))
    with torch.enable_grad():
        assert paths_taken(model, x) == ["chunked", "chunked"]
        logits = model(x).logits
    assert len(refs) == 2 and logits.requires_grad
    del logits
    gc.collect()
    assert all(r() is None for r in refs)
