"""Code the tests share: tiny tokenizers and random-weight models the tests build themselves, a run config
that trains in about a second, the CLI run in-process. Imported as ``from helpers import ...`` (pytest puts
tests/ on sys.path); conftest.py holds only fixtures and hooks."""

from __future__ import annotations

import os
from pathlib import Path

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


def char_tokenizer():
    """One token per character (printable ASCII and newline), <s> = 1 added in front, decoded by concatenation."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for c in "\n" + "".join(chr(i) for i in range(32, 127)):
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>")


def tiny_llama(vocab_size: int = 80, **kw):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(**{**dict(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128), **kw})
    return LlamaForCausalLM(cfg).eval()


def tiny_gemma2_mixed(sliding_window: int = 8):
    """A random 2-layer Gemma 2 (vocabulary 128, hidden 32, 4 query / 2 kv heads of 8) whose layer 0 is a sliding
    window of ``sliding_window`` and layer 1 full attention: a model that mixes windowed and global layers."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Gemma2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=sliding_window,
                                    layer_types=["sliding_attention", "full_attention"])
    return transformers.Gemma2ForCausalLM(cfg).eval()


def tiny_gpt2(vocab_size: int = 80):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=2, n_head=4, n_positions=128)).eval()


def tiny_neox(vocab_size: int = 80, **kw):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    cfg = GPTNeoXConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=128, **kw)
    return GPTNeoXForCausalLM(cfg).eval()


def tiny_bert(vocab_size: int = 80):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, max_position_embeddings=128)
    return BertModel(cfg, add_pooling_layer=False).eval()


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


def tiny_sinklm(att, pos, backend="reference", window=None, seed=0, options=None, vocab_size=32):
    """A 2-layer SinkLM (d 32, 4 heads / 2 KV heads) with operation ``att``, positional ``pos`` and attention
    backend ``backend``, its 1-d parameters (sink logit, k/v biases, norm gains, T5 table) moved off their init
    so that they matter."""
    from sinklab.nn import ModelConfig, SinkLM

    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab_size, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, max_seq_len=64,
                      attention=att, positional=pos, sliding_window=window, attention_backend=backend)
    m = SinkLM(cfg, attention_options=options)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if p.dim() == 1 or "positional" in n:
                p.add_(torch.randn_like(p) * 0.5)
    return m


def share_compiled_kernels_between_checkouts() -> None:
    """Let every checkout on this machine reuse the C++ kernels that ``torch.compile`` built in another one.

    Inductor keys each kernel's shared library by its source and its compile command, and the command names
    the torch headers and libraries by the venv's path: a new clone (``make setup`` puts ``.venv`` inside it)
    found every FX graph in ``/tmp/torchinductor_*`` but ran the C++ compiler again for every kernel (about
    110 CPU-s of the compile lane, benchmarks/results/test_times.md). Here inductor is pointed at the venv's
    torch through a link whose path names only torch's version and build, ``<tmp>/sinklab-torch-<version>-
    <git sha>``, so the command, and so the key, is the same in every checkout of the same torch build; the
    headers behind it are the same files. Test set-up only: the library never does this. If torch no longer has
    the private names patched here, nothing is changed."""
    import tempfile

    import torch.utils.cpp_extension as ext

    here = getattr(ext, "_TORCH_PATH", None)
    if not isinstance(here, str) or not isinstance(getattr(ext, "TORCH_LIB_PATH", None), str):
        return
    build = (getattr(torch.version, "git_version", None) or "unknown")[:12]
    link = Path(tempfile.gettempdir()) / f"sinklab-torch-{torch.__version__}-{build}".replace("+", "_")
    try:
        if not (link.is_symlink() and link.resolve() == Path(here).resolve()):
            # a link left by another checkout (or one whose venv is gone): point it here, atomically
            tmp = link.with_name(f"{link.name}.{os.getpid()}")
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(here, target_is_directory=True)
            os.replace(tmp, link)
    except OSError:
        return
    ext._TORCH_PATH = str(link)
    ext.TORCH_LIB_PATH = str(link / "lib")


def train_run(tmp, name: str, toml: str, *overrides: str, stop_after: int | None = None):
    """Train the run config text ``toml`` (with ``--set``-style ``overrides``) into ``tmp/name``; returns the folder."""
    from sinklab.runs.config import load_config
    from sinklab.train import loop

    f = tmp / f"{name}.toml"
    f.write_text(toml)
    out = tmp / name
    loop.train(load_config(f, list(overrides)), out, progress=False, stop_after=stop_after)
    return out


def word_texts(folder, n: int = 12, words: int = 300, seed: int = 0):
    """``folder`` (created) with ``n`` .txt documents of ``words`` common English words drawn at random (seeded)."""
    import random

    vocab = "the of and to in a is that for it as was with be by on not he this are or his from at which".split()
    rng = random.Random(seed)
    folder.mkdir()
    for i in range(n):
        (folder / f"d{i}.txt").write_text(" ".join(rng.choice(vocab) for _ in range(words)))
    return folder


def text_run_toml(texts, packing: str = "bos", steps: int = 4) -> str:
    """:func:`synthetic_run_toml` trained on the text documents in ``texts`` (sinklab's BPE of 270) instead."""
    return synthetic_run_toml(steps=steps, packing=packing).replace(
        'source = "synthetic-bigram-backcopy"\nsynthetic = { vocab = 16, n_triggers = 2, n_train_docs = 256, '
        'n_val_docs = 64 }', f'corpus = "{texts}"\nvocab_size = 270\nval_fraction = 0.25\ncache_dir = "run"')
