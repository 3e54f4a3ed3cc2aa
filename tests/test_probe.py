"""Probe generators: BOS policies, window placement, seeds, bad input."""

import pytest
import torch

from sinklab.errors import InputError, UnknownNameError
from sinklab.probe import bos_tokens, make_probe

DOCS = [" ".join(f"w{i}" for i in range(n)) for n in (30, 7, 25)]


def test_bos_policies(tokenizer, tokenizer_nobos):
    assert bos_tokens(tokenizer, "auto") == ([1], [])
    assert bos_tokens(tokenizer_nobos, "auto") == ([], [])
    assert bos_tokens(tokenizer_nobos, "always") == ([1], [])
    assert bos_tokens(tokenizer, "never") == ([], [])
    with pytest.raises(InputError, match="BOS policy"):
        bos_tokens(tokenizer, "sometimes")


@pytest.mark.parametrize("bos,first", [("always", 1), ("never", None)])
def test_natural_windows_stay_in_documents(tokenizer_nobos, bos, first):
    p = make_probe("natural", tokenizer_nobos, documents=DOCS, num_samples=5, seq_len=6, bos=bos, seed=0)
    assert p.input_ids.shape == (5, 6)
    n = 5 if bos == "always" else 6
    token_docs = tokenizer_nobos(DOCS, add_special_tokens=False)["input_ids"]
    for row, d, o in zip(p.input_ids.tolist(), p.details["document"], p.details["offset"]):
        if first is not None:
            assert row[0] == first
        content = row[-n:]
        assert content == token_docs[d][o : o + n]
        assert o + n <= len(token_docs[d])  # never crosses the document's end
    # windows available: floor(30/n) + floor(7/n) + floor(25/n)
    assert p.details["windows_available"] == 30 // n + 7 // n + 25 // n


def test_natural_seed_reproducible_and_distinct(tokenizer):
    a = make_probe("natural", tokenizer, documents=DOCS, num_samples=4, seq_len=6, seed=3)
    b = make_probe("natural", tokenizer, documents=DOCS, num_samples=4, seq_len=6, seed=3)
    c = make_probe("natural", tokenizer, documents=DOCS, num_samples=4, seq_len=6, seed=4)
    assert torch.equal(a.input_ids, b.input_ids)
    assert not torch.equal(a.input_ids, c.input_ids)
    assert len({tuple(r) for r in a.input_ids.tolist()}) == 4  # drawn without replacement


def test_natural_too_few_windows_says_how_many(tokenizer):
    with pytest.raises(InputError, match=r"only 2 windows"):
        make_probe("natural", tokenizer, documents=DOCS, num_samples=10, seq_len=21)  # 20 content tokens


def test_random_excludes_special_tokens(tokenizer):
    p = make_probe("random", tokenizer, num_samples=50, seq_len=20, seed=0)
    content = p.input_ids[:, 1:]
    assert (p.input_ids[:, 0] == 1).all()
    assert not torch.isin(content, torch.tensor(tokenizer.all_special_ids)).any()
    assert content.max() < len(tokenizer) and len(content.unique()) > 30


def test_random_and_repeated_exclude_added_tokens_flagged_special():
    """An added token the tokenizer flags ``special`` but does not list in ``all_special_ids`` (SmolLM2's
    ``<repo_name>`` ... at ids 3-16) is no probe token either (it was: 89 of 5000 random SmolLM2 windows held
    one; outside audit, 2026-12-07)."""
    from tokenizers import AddedToken

    from helpers import make_tokenizer
    from sinklab.probe.inputs import candidate_token_ids

    tok = make_tokenizer()
    tok.add_tokens([AddedToken("<repo_name>", special=True), AddedToken("plainword", special=False)])
    flagged, plain = tok.convert_tokens_to_ids(["<repo_name>", "plainword"])
    assert flagged not in tok.all_special_ids  # the case: flagged special, not listed
    pool = candidate_token_ids(tok).tolist()
    assert flagged not in pool and plain in pool
    assert sorted(pool) == [i for i in range(len(tok)) if i not in set(tok.all_special_ids) | {flagged}]
    p = make_probe("random", tok, num_samples=200, seq_len=20, seed=0)
    assert not (p.input_ids[:, 1:] == flagged).any()


def test_repeated(tokenizer):
    p = make_probe("repeated", tokenizer, num_samples=6, seq_len=9, seed=0)
    for row, t in zip(p.input_ids.tolist(), p.details["token"]):
        assert row == [1] + [t] * 8
    assert len(set(p.details["token"])) > 1
    q = make_probe("repeated", tokenizer, num_samples=2, seq_len=5, token=7, bos="never")
    assert q.input_ids.tolist() == [[7] * 5] * 2
    with pytest.raises(InputError, match="outside the vocabulary"):
        make_probe("repeated", tokenizer, num_samples=1, seq_len=5, token=10_000)


def test_text(tokenizer):
    p = make_probe("text", tokenizer, text="the sink token . the a", seq_len=4)
    assert p.input_ids.tolist() == [[1] + tokenizer("the sink token", add_special_tokens=False)["input_ids"]]
    with pytest.raises(InputError, match="has 2 tokens"):
        make_probe("text", tokenizer, text="the sink", seq_len=8)
    with pytest.raises(UnknownNameError, match="natural"):
        make_probe("poetry", tokenizer, seq_len=4)


def test_token_cache_equals_direct_tokenization(tokenizer_nobos, tokenizer):
    from sinklab.paths import cache_dir
    from sinklab.probe.cache import tokenize_documents

    direct = tokenizer_nobos(DOCS, add_special_tokens=False)["input_ids"]
    first = tokenize_documents(tokenizer_nobos, DOCS)  # computes and writes
    files = list(cache_dir("probe_tokens").glob("*.npz"))
    assert len(files) == 1
    second = tokenize_documents(tokenizer_nobos, DOCS)  # reads
    assert [d.tolist() for d in first] == [d.tolist() for d in second] == direct
    # a different corpus or tokenizer gets its own entry
    tokenize_documents(tokenizer_nobos, DOCS[:2])
    tokenize_documents(tokenizer, DOCS)
    assert len(list(cache_dir("probe_tokens").glob("*.npz"))) == 3
    a = make_probe("natural", tokenizer_nobos, documents=DOCS, num_samples=4, seq_len=6, seed=1)
    b = make_probe("natural", tokenizer_nobos, documents=DOCS, num_samples=4, seq_len=6, seed=1, token_docs=second)
    assert torch.equal(a.input_ids, b.input_ids)


def test_auto_bos_reads_a_word_level_tokenizer_without_an_unknown_token():
    """bos='auto' encoded the text "hello" to find the tokenizer's special tokens; a word-level vocabulary without
    an unknown token (a synthetic sinklab run's) cannot, and random input, which needs no text, failed with
    'Missing [UNK]'. It now reads them off an ordinary vocabulary entry: the BOS the tokenizer adds, before."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from sinklab.probe.inputs import bos_tokens

    vocab = {"<s>": 0, "</s>": 1, "apple": 2, "pear": 3}
    for add, want in ((True, ([0], [])), (False, ([], []))):
        tok = Tokenizer(models.WordLevel(vocab=vocab))  # no unk_token
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        if add:
            tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
        with pytest.raises(Exception):
            fast("hello")  # what the policy was read off before
        assert bos_tokens(fast, "auto") == want
