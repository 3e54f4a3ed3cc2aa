"""Seeded, tokenizer-aware probe generators (Gu et al. 2025, Sec. 3: natural, random
and repeated-token inputs).

Every generator returns ``N`` sequences of exactly ``T`` token ids, BOS (or the
encoder's CLS/SEP) **included** in ``T``. The BOS policy is explicit:

* ``auto``   -- whatever the tokenizer adds by itself (``add_special_tokens=True``);
* ``always`` -- a BOS token first (the CLS token for an encoder without BOS);
* ``never``  -- no special tokens at all.

Generators never produce a window that crosses a document boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import Tensor

from sinklab.errors import InputError, param
from sinklab.probe.windows import CORPUS_WORDING, cut_windows
from sinklab.registry import Registry

BOS_POLICIES = ("auto", "always", "never")


@dataclass
class Probe:
    """A probe set.

    Attributes:
        input_ids: (N, T) int64 token ids fed to the model, special tokens included.
        kind: generator name (``natural``, ``random``, ``repeated``, ``text``).
        bos: BOS policy used.
        prefix, suffix: special token ids added before/after the content.
        details: generator-specific facts (document indices and offsets, repeated token ids...).
    """

    input_ids: Tensor
    kind: str
    bos: str
    prefix: list[int]
    suffix: list[int]
    details: dict = field(default_factory=dict)


#: the key under which ``transformers`` tokenizers remember having warned "Token indices sequence length
#: is longer than the specified maximum sequence length for this model" (they warn once, then set it)
LONG_SEQUENCE_WARNING = "sequence-length-is-longer-than-the-specified-maximum"


def tokenize_plain(tokenizer, texts):
    """Token ids of ``texts`` (a string or a list of strings), no special tokens (a special token's text inside them
    is encoded as text), without that warning.

    sinklab tokenizes whole documents and cuts its windows of T tokens itself, so a document longer
    than the model's maximum length is expected: the tokenizer's "sequence length is longer than the
    specified maximum" warning is silenced for this call only (every other warning stays, and the
    tokenizer warns as before on later calls of the user's own).
    """
    flags = getattr(tokenizer, "deprecation_warnings", None)
    # split_special_tokens: a special token's text inside the text ("<|endoftext|>") is encoded as text, not as the id
    if not isinstance(flags, dict):
        return tokenizer(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    had, before = LONG_SEQUENCE_WARNING in flags, flags.get(LONG_SEQUENCE_WARNING)
    flags[LONG_SEQUENCE_WARNING] = True
    try:
        return tokenizer(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    finally:
        if had:
            flags[LONG_SEQUENCE_WARNING] = before
        else:
            flags.pop(LONG_SEQUENCE_WARNING, None)


def bos_tokens(tokenizer, bos: str) -> tuple[list[int], list[int]]:
    """Special token ids to put before and after the content under a BOS policy.

    Args:
        tokenizer: a ``transformers`` tokenizer.
        bos: ``auto`` | ``always`` | ``never``.

    Returns:
        (prefix ids, suffix ids).

    Raises:
        InputError: unknown policy, or ``always`` for a tokenizer with neither BOS nor CLS.
    """
    if bos not in BOS_POLICIES:
        raise InputError(f"unknown BOS policy {bos!r}; valid: {', '.join(BOS_POLICIES)}")
    if bos == "never":
        return [], []
    if bos == "auto":
        from sinklab.tokenizing import sample_encoding

        _, plain, full = sample_encoding(tokenizer)
        n = len(plain)
        for start in range(len(full) - n + 1):
            if full[start : start + n] == plain:
                return list(full[:start]), list(full[start + n :])
        return [], []
    tok_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id
    if tok_id is None:
        raise InputError(f"{param('bos', 'always')}: this tokenizer has no BOS (or CLS) token")
    return [int(tok_id)], []


def _content_len(seq_len: int, prefix: list[int], suffix: list[int]) -> int:
    n = seq_len - len(prefix) - len(suffix)
    if n < 1:
        raise InputError(f"seq_len {seq_len} leaves no room for content after {len(prefix) + len(suffix)} special tokens")
    return n


def _assemble(content: Tensor, prefix: list[int], suffix: list[int]) -> Tensor:
    N = content.shape[0]
    pre = torch.tensor(prefix, dtype=torch.int64).expand(N, len(prefix))
    suf = torch.tensor(suffix, dtype=torch.int64).expand(N, len(suffix))
    return torch.cat([pre, content.to(torch.int64), suf], dim=1)


def candidate_token_ids(tokenizer) -> Tensor:
    """Token ids eligible for random/repeated probes: the vocabulary minus special tokens, (V',) int64.

    Special: the tokenizer's ``all_special_ids`` and every added token it flags ``special`` (SmolLM2's
    ``<repo_name>``, ``<file_sep>``, ``<jupyter_*>`` ... at ids 3-16 are flagged so but are not in
    ``all_special_ids``, which lists only ids 0-2)."""
    special = set(int(i) for i in tokenizer.all_special_ids)
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    special |= {int(i) for i, tok in added.items() if getattr(tok, "special", False)}
    ids = torch.arange(len(tokenizer), dtype=torch.int64)
    keep = torch.tensor([int(i) not in special for i in range(len(tokenizer))])
    return ids[keep]


INPUTS: Registry[Callable[..., Probe]] = Registry("probe input")


@INPUTS.register("natural", description="windows of natural text from a corpus, one document per window")
def natural(
    tokenizer,
    *,
    documents: Sequence[str],
    num_samples: int,
    seq_len: int,
    bos: str = "auto",
    seed: int = 0,
    token_docs: Sequence[Sequence[int]] | None = None,
    **_: object,
) -> Probe:
    """``N`` windows of ``T`` tokens of natural text.

    Each document is tokenized (no special tokens) and cut into non-overlapping
    windows of ``T - #special`` tokens starting at token 0 of the document; ``N``
    of all such windows are drawn without replacement (seeded) and kept in corpus
    order. No window crosses a document boundary.

    Args:
        tokenizer: ``transformers`` tokenizer.
        documents: plain-text documents.
        num_samples: N.
        seq_len: T, special tokens included.
        bos: BOS policy.
        seed: seed of the window draw.
        token_docs: already tokenized documents (skips tokenization).

    Returns:
        Probe with details ``document`` (N,) and ``offset`` (N,) (0-based token offsets).

    Raises:
        InputError: the corpus has fewer than N windows of that length (the message says how many).
    """
    prefix, suffix = bos_tokens(tokenizer, bos)
    n = _content_len(seq_len, prefix, suffix)
    if token_docs is None:
        token_docs = tokenize_plain(tokenizer, list(documents))
    w = cut_windows([len(ids) for ids in token_docs], num_samples, n, stride=n, draw="permutation", seed=seed,
                    special=seq_len - n, wording=CORPUS_WORDING)
    chosen = list(zip(w.doc.tolist(), w.offset.tolist()))
    content = torch.tensor([[int(t) for t in token_docs[d][o : o + n]] for d, o in chosen], dtype=torch.int64)
    return Probe(
        _assemble(content, prefix, suffix), "natural", bos, prefix, suffix,
        {"document": [d for d, _ in chosen], "offset": [o for _, o in chosen], "windows_available": w.available},
    )


@INPUTS.register("random", description="uniformly random token ids, special tokens excluded")
def random_tokens(tokenizer, *, num_samples: int, seq_len: int, bos: str = "auto", seed: int = 0, **_: object) -> Probe:
    """``N`` sequences of token ids drawn uniformly (seeded) from the vocabulary minus special tokens."""
    prefix, suffix = bos_tokens(tokenizer, bos)
    n = _content_len(seq_len, prefix, suffix)
    pool = candidate_token_ids(tokenizer)
    gen = torch.Generator().manual_seed(seed)
    content = pool[torch.randint(0, len(pool), (num_samples, n), generator=gen)]
    return Probe(_assemble(content, prefix, suffix), "random", bos, prefix, suffix)


@INPUTS.register("repeated", description="one token repeated T times (random per sample unless --token)")
def repeated(
    tokenizer, *, num_samples: int, seq_len: int, bos: str = "auto", seed: int = 0, token: int | None = None, **_: object
) -> Probe:
    """``N`` sequences of one token repeated; the token is drawn per sample (seeded) unless ``token`` is given.

    Raises:
        InputError: ``token`` outside the vocabulary.
    """
    prefix, suffix = bos_tokens(tokenizer, bos)
    n = _content_len(seq_len, prefix, suffix)
    if token is not None:
        if not 0 <= token < len(tokenizer):
            raise InputError(f"{param('token', token)} is outside the vocabulary (size {len(tokenizer)})")
        toks = torch.full((num_samples,), token, dtype=torch.int64)
    else:
        pool = candidate_token_ids(tokenizer)
        gen = torch.Generator().manual_seed(seed)
        toks = pool[torch.randint(0, len(pool), (num_samples,), generator=gen)]
    content = toks[:, None].expand(num_samples, n)
    return Probe(_assemble(content, prefix, suffix), "repeated", bos, prefix, suffix, {"token": toks.tolist()})


@INPUTS.register("text", description="the user's own text (--text), first T tokens, one sample")
def user_text(tokenizer, *, text: str | None, seq_len: int, bos: str = "auto", **_: object) -> Probe:
    """The first ``T`` tokens of ``text`` as a single sample.

    Raises:
        InputError: no text, or a text shorter than T tokens (says how many it has).
    """
    if not text:
        raise InputError(f"{param('input', 'text')} needs {param('text')} 'some text'")
    prefix, suffix = bos_tokens(tokenizer, bos)
    n = _content_len(seq_len, prefix, suffix)
    ids = tokenize_plain(tokenizer, text)
    if len(ids) < n:
        raise InputError(f"the text has {len(ids)} tokens, fewer than the {n} needed for {param('seq_len', seq_len)}")
    content = torch.tensor([ids[:n]], dtype=torch.int64)
    return Probe(_assemble(content, prefix, suffix), "text", bos, prefix, suffix)


def make_probe(kind: str, tokenizer, **kwargs) -> Probe:
    """Build a probe set with the generator registered as ``kind`` (see :data:`INPUTS`).

    Raises:
        UnknownNameError: unknown kind (lists the valid ones).
        InputError: see each generator.
    """
    return INPUTS.get(kind)(tokenizer, **kwargs)
