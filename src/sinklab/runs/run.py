"""A ``sinklab train`` run and everything rebuilt from it: :class:`Run`.

A run folder ``DIR`` holds ``config.toml`` (the fully resolved :class:`~sinklab.runs.config.RunConfig`),
the training log, checkpoints and, once finished, ``final/`` (the model and its tokenizer). From the
config alone :class:`Run` rebuilds what the training used: the tokenized corpus (synthetic task, real
text or n-gram text, prepared exactly as for training), the packing of its windows, the tracker's probe
set, the held-out documents and stream; from ``final/`` it loads the model. Every feature that works on
a trained run (the training loop itself, ``measure``, ``analyze``, ``stream``, the sweep summary) goes
through it, so the run is rebuilt one way.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from sinklab.errors import ConfigError, InputError, param
from sinklab.runs.config import RunConfig

if TYPE_CHECKING:
    from sinklab.data.packing import Packer, PackingContext
    from sinklab.data.tokens import TokenizedCorpus
    from sinklab.probe import Probe
    from sinklab.models import LoadedModel


def prepare_data(cfg: RunConfig, out: Path) -> "TokenizedCorpus":
    """Tokenize (or reuse the cached tokens of) the configured corpus; for ``data.source = "ngram"``
    sample the training documents from an n-gram model of it; build a synthetic corpus.

    Args:
        cfg: the run's config (its ``data`` section is read).
        out: the run folder (``data.cache_dir = "run"`` caches the tokens in ``out/tokens``).

    Raises:
        InputError / FetchError / ConfigError: as :func:`sinklab.data.tokens.prepare_corpus` and the
            synthetic and n-gram builders.
    """
    from sinklab.data.tokens import prepare_corpus

    d = cfg.data
    if d.source not in ("corpus", "ngram"):
        from sinklab.data.synthetic import load_synthetic

        return load_synthetic(d.source, d.synthetic, d.seq_len)
    cache = None if d.cache_dir == "" else (Path(out) / "tokens" if d.cache_dir == "run" else Path(d.cache_dir))
    tc = prepare_corpus(d.corpus, tokenizer=d.tokenizer, vocab_size=d.vocab_size, val_fraction=d.val_fraction,
                        split_seed=d.split_seed, cache_root=cache, text_field=d.text_field or "text",
                        num_proc=d.num_proc)
    if d.source == "ngram":
        from sinklab.data.ngram import ngram_corpus

        return ngram_corpus(tc, d.ngram or {})
    return tc


def packing_context(cfg: RunConfig, tc: "TokenizedCorpus") -> "PackingContext":
    """The :class:`~sinklab.data.packing.PackingContext` of the run's packing (special ids, vocabulary,
    inserted-token position and id, seed ``train.seed``).

    Raises:
        ConfigError: ``data.packing = "fixed_token"`` with a ``data.packing_token`` that is not one token.
    """
    from sinklab.data.packing import PackingContext

    tok_id = None
    if cfg.data.packing == "fixed_token":
        tok_id = tc.tokenizer.token_to_id(cfg.data.packing_token)
        if tok_id is None:
            raise ConfigError(f"data.packing_token={cfg.data.packing_token!r} is not a single token of the tokenizer")
    return PackingContext(eos_id=tc.eos_id, bos_id=tc.bos_id, vocab_size=tc.vocab_size,
                          position=cfg.data.packing_position, token_id=tok_id, seed=cfg.train.seed)


def _load_run_config(folder: Path) -> RunConfig:
    from sinklab.runs.config import load_config

    cfg_file = folder / "config.toml"
    try:
        return load_config(cfg_file)
    except ConfigError as e:
        if str(cfg_file) in str(e):
            raise
        raise ConfigError(f"{cfg_file} (the run's config) is invalid: {e}") from None


class Run:
    """A training run: its folder and resolved config, and what is rebuilt from them (lazily, once).

    ``Run(cfg, folder)`` is a run being created (the training loop); :meth:`open` and :meth:`find`
    open an existing one. Attributes: ``folder`` (the run folder), ``config`` (its
    :class:`~sinklab.runs.config.RunConfig`). Positions are 0-based throughout.
    """

    def __init__(self, config: RunConfig, folder: str | Path) -> None:
        self.config = config
        self.folder = Path(folder)
        self._packers: dict[str, Packer] = {}

    def __repr__(self) -> str:
        return f"Run({str(self.folder)!r})"

    # ------------------------------------------------------------------ opening
    @classmethod
    def find(cls, model: str | Path) -> "Run | None":
        """The run behind ``model`` when it is a run folder or the ``final/`` of one, else None.

        Raises:
            InputError: a run folder without ``final/`` (says where it is expected).
            ConfigError: the run's ``config.toml`` is invalid.
        """
        from sinklab.models import NATIVE_MARKER, is_run_folder, run_final_folder

        p = Path(model).expanduser()
        if not p.is_dir():
            return None
        p = p.resolve()
        if is_run_folder(p) and not (p / NATIVE_MARKER).exists():
            run_final_folder(p)  # raises when final/ is missing
            folder = p
        elif (p / NATIVE_MARKER).exists() and is_run_folder(p.parent):
            folder = p.parent
        else:
            return None
        return cls(_load_run_config(folder), folder)

    @classmethod
    def open(cls, folder: str | Path) -> "Run":
        """The finished run in ``folder`` (a run folder or its ``final/``).

        Raises:
            InputError: ``folder`` is not a ``sinklab train`` run folder (nor its ``final/``), or the run
                has no ``final/`` yet.
            ConfigError: its ``config.toml`` is invalid.
        """
        run = cls.find(folder)
        if run is None:
            raise InputError(f"{folder} is not a `sinklab train` run folder (config.toml, metrics.jsonl, final/) "
                             "nor the final/ of one")
        return run

    @property
    def final(self) -> Path:
        """``folder/final``: the finished model and its tokenizer."""
        return self.folder / "final"

    # ------------------------------------------------------------------ defaults taken from the run
    @property
    def seq_len(self) -> int:
        """T of the training windows (``data.seq_len``), the default sequence length of a feature."""
        return self.config.data.seq_len

    @property
    def prefix_len(self) -> int:
        """Bidirectional prefix of the prefix-LM mask the model was trained with (0: causal)."""
        return self.config.train.prefix_len

    @property
    def synthetic(self) -> bool:
        """True when the run trained on a synthetic task instead of text."""
        return self.config.data.source != "corpus"

    @property
    def data_name(self) -> str:
        """The training data's name: the synthetic task, or the corpus (``a+b`` for a mixture)."""
        d = self.config.data
        return d.source if self.synthetic else (d.corpus if isinstance(d.corpus, str) else "+".join(d.corpus))

    @property
    def bos_policy(self) -> str:
        """``always`` when the run put BOS at the start of its windows, else ``never``."""
        d = self.config.data
        if d.packing == "bos":
            return "always"
        if d.packing == "fixed_token" and d.packing_position == 0 and d.packing_token == "<|bos|>":
            return "always"
        return "never"

    def packing_for(self, bos: str) -> str:
        """The packing of a probe under a BOS policy: the run's own for ``auto``, ``concat`` for
        ``never``, ``bos`` for ``always``."""
        return {"auto": self.config.data.packing, "never": "concat", "always": "bos"}[bos]

    def probe_len(self, bos: str = "auto") -> int:
        """Default probe length (tokens) under ``bos``: the tracker's windows (``track.probe_len``), with
        the BOS (or other inserted token) dropped or added, so that the text chunks are the tracker's
        (one token shorter when an added BOS would exceed the model's context)."""
        from sinklab.data.packing import PACKING

        own = PACKING.get(self.config.data.packing).n_probe_inserted
        n = self.config.track.probe_len - own + PACKING.get(self.packing_for(bos)).n_probe_inserted
        return min(n, self.config.model.max_seq_len)  # an added BOS must not push T past the model's context

    # ------------------------------------------------------------------ data
    @cached_property
    def corpus(self) -> "TokenizedCorpus":
        """The run's data prepared as for training (:func:`prepare_data`), computed once.

        Raises:
            InputError: the data differs from what the run trained on (``summary.json``'s ``data_key``, the
                content digest of the tokenized corpus: a corpus file edited, added or removed since), so its
                held-out split, probe and tokenizer would not be the run's."""
        tc = prepare_data(self.config, self.folder)
        summary = self.folder / "summary.json" if self.folder is not None else None
        if summary is not None and summary.is_file():
            from sinklab.fileio import read_json

            trained_on, now = read_json(summary, "run summary").get("data_key"), tc.meta.get("key")
            if trained_on is not None and now != trained_on:
                raise InputError(f"the run {self.folder} was trained on other data than its corpus holds now "
                                 f"(tokenized data {trained_on}, now {now}: a corpus file edited, added or removed): "
                                 "its held-out windows and probe cannot be rebuilt; restore the corpus")
        return tc

    @cached_property
    def packing_context(self) -> "PackingContext":
        """:func:`packing_context` of the run's data."""
        return packing_context(self.config, self.corpus)

    def packer(self, packing: str | None = None) -> "Packer":
        """A packer (registry :data:`sinklab.data.packing.PACKING`) in the run's context; ``packing``
        defaults to the run's own ``data.packing``. One packer per name (made once)."""
        from sinklab.data.packing import make_packer

        name = packing or self.config.data.packing
        if name not in self._packers:
            self._packers[name] = make_packer(name, self.packing_context)
        return self._packers[name]

    def tracker_probe(self) -> torch.Tensor:
        """The sink tracker's probe set: ``track.n_probe`` windows of ``track.probe_len`` tokens from the
        validation split in the run's packing, seed ``track.seed`` (:func:`sinklab.probe.windows.probe_set`).
        (n_probe, probe_len) int64.

        Raises:
            InputError: too few windows in the validation split (names the settings to change).
        """
        from sinklab.probe.windows import probe_set

        t = self.config.track
        return probe_set(self.corpus.val, self.packer(), t.n_probe, t.probe_len, seed=t.seed)

    def probe(self, num_samples: int, seq_len: int, seed: int, bos: str = "auto", tokenizer=None) -> "Probe":
        """``num_samples`` windows of ``seq_len`` tokens from the run's validation split, in its packing
        (``bos``: ``auto`` = the run's packing; ``never`` = plain text windows; ``always`` = BOS then text).

        ``tokenizer``: the tokenizer saved in ``final/``; when given, the data prepared now must use the
        same vocabulary.

        Returns:
            :class:`~sinklab.probe.Probe` of kind ``run`` (details: run, data, split, packing, seed,
            ``tracker_probe``: whether it is exactly the tracker's probe set).

        Raises:
            InputError: the validation split has too few windows of that length, or the run's data no
                longer tokenizes with the vocabulary the model was saved with.
        """
        from sinklab.data.tokenizer import MASK_TOKEN
        from sinklab.probe import Probe
        from sinklab.probe.windows import RUN_WORDING, probe_set

        c, tc = self.config, self.corpus
        saved = None if tokenizer is None else dict(tokenizer.get_vocab())
        if saved is not None and c.diffusion:  # a masked diffusion run's tokenizer has the mask token added
            saved.pop(MASK_TOKEN, None)
        if saved is not None and tc.tokenizer.get_vocab() != saved:
            raise InputError(f"the data of {self.folder} prepared now has another vocabulary than the tokenizer in "
                             f"{self.final}; measure it with {param('input', 'natural')}, random or repeated instead")
        packing = self.packing_for(bos)
        try:
            ids = probe_set(tc.val, self.packer(packing), num_samples, seq_len, seed=seed, settings=RUN_WORDING)
        except InputError as e:
            raise InputError(f"{e.marked} (the validation split of the run {self.folder})") from None
        t = c.track
        details = {
            "run": str(self.folder), "data": self.data_name, "split": "validation", "packing": packing, "seed": seed,
            "tracker_probe": (num_samples, seq_len, seed, packing) == (t.n_probe, t.probe_len, t.seed, c.data.packing),
        }
        # the token every training window starts with, before its text: BOS (packing bos) or a fixed token at
        # position 0 (fixed_token, BOS by default); what the cloze items are scored after (random first tokens: none)
        prefix = [int(tc.bos_id)] if packing == "bos" else []
        if packing == "fixed_token" and c.data.packing_position == 0:
            ctx = self.packing_context
            prefix = [int(tc.bos_id if ctx.token_id is None else ctx.token_id)]
        return Probe(ids, "run", bos, prefix, [], details)

    def validation_documents(self) -> list[np.ndarray]:
        """Token ids of every document of the run's validation split, one (len_d,) int array per
        document, in order."""
        val = self.corpus.val
        return [val.doc(d) for d in range(val.n_docs)]

    def validation_stream(self, n_tokens: int) -> torch.Tensor:
        """The held-out stream: BOS, then the validation documents in order, each followed by EOS as the
        training stream joins them; the first ``n_tokens`` ids ((n_tokens,) int64). (Before 2026-12-07 the
        documents were joined with no separator, so two documents ran into each other mid-word.)

        Raises:
            InputError: fewer validation tokens than ``n_tokens`` (says how many).
        """
        from sinklab.data.packing import join_documents

        tc = self.corpus
        ids = np.concatenate([[int(tc.bos_id)], join_documents(tc.val, int(tc.eos_id), None)])
        if ids.size < n_tokens:
            raise InputError(f"the validation split of {self.folder} has {ids.size} tokens in all (BOS and EOS included), "
                             f"fewer than {param('tokens', n_tokens)}")
        return torch.from_numpy(ids[:n_tokens].copy())

    # ------------------------------------------------------------------ model
    def load(self, *, dtype: torch.dtype | None = None, attn_implementation: str | None = "sdpa",
             device: str = "cpu") -> "LoadedModel":
        """The finished model and tokenizer of ``final/`` (:func:`sinklab.models.load_model`), eval
        mode.

        Raises:
            InputError: the run has no ``final/``. CaptureError: sinklab.nn cannot load it.
        """
        from sinklab.models import load_model

        return load_model(str(self.final), dtype=dtype, attn_implementation=attn_implementation, device=device)

    @cached_property
    def model(self):
        """The finished :class:`~sinklab.nn.SinkLM` of ``final/`` on the CPU, float32, eval mode
        (loaded once)."""
        from sinklab.nn.model import SinkLM

        return SinkLM.from_pretrained(self.final).eval()

    @cached_property
    def tokenizer(self):
        """The ``transformers`` tokenizer saved in ``final/`` (loaded once)."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.final))
