"""Measuring a model trained by ``sinklab train``: find its run folder, and build the probe from the
run's own held-out data in the run's own format.

The default probe of such a model (``--input auto`` resolves to ``run``) is what the run's sink
tracker measured: :func:`sinklab.data.probe.probe_set` on the validation split of the run's data
(synthetic task or real text, prepared exactly as for training), in the run's packing (BOS or not),
with the tracker's size and seed unless ``--num-samples``/``--seq-len``/``--seed`` say otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sinklab.errors import ConfigError, InputError, SinklabError
from sinklab.probe import Probe
from sinklab.zoo.models import NATIVE_MARKER, is_run_folder, run_final_folder


@dataclass
class TrainedRun:
    """A ``sinklab train`` run folder: ``folder/config.toml`` and the model in ``final``."""

    folder: Path
    final: Path
    config: Any  # sinklab.train.config.RunConfig

    @property
    def synthetic(self) -> bool:
        """True when the run trained on a synthetic task instead of text."""
        return self.config.data.source != "corpus"

    @property
    def data_name(self) -> str:
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
        """The packing of the probe under a BOS policy: the run's own for ``auto``."""
        return {"auto": self.config.data.packing, "never": "concat", "always": "bos"}[bos]

    def probe_len(self, bos: str) -> int:
        """Default probe length under ``bos``: the tracker's windows, with the BOS (or other inserted
        token) dropped or added, so that the text chunks are the tracker's (one token shorter when an
        added BOS would exceed the model's context)."""
        from sinklab.data.packing import PACKING

        own = PACKING.get(self.config.data.packing).n_probe_inserted
        n = self.config.track.probe_len - own + PACKING.get(self.packing_for(bos)).n_probe_inserted
        return min(n, self.config.model.max_seq_len)  # an added BOS must not push T past the model's context


def find_run(model: str) -> TrainedRun | None:
    """The run behind ``--model`` when it is a run folder or the ``final/`` of one, else None.

    Raises:
        InputError: a run folder without ``final/`` (says where it is expected).
        ConfigError: the run's config.toml is invalid.
    """
    p = Path(model).expanduser()
    if not p.is_dir():
        return None
    p = p.resolve()
    if is_run_folder(p) and not (p / NATIVE_MARKER).exists():
        folder, final = p, run_final_folder(p)
    elif (p / NATIVE_MARKER).exists() and is_run_folder(p.parent):
        folder, final = p.parent, p
    else:
        return None
    from sinklab.train.config import load_config

    cfg_file = folder / "config.toml"
    try:
        cfg = load_config(cfg_file)
    except ConfigError as e:
        if str(cfg_file) in str(e):
            raise
        raise ConfigError(f"{cfg_file} (the run's config) is invalid: {e}") from None
    return TrainedRun(folder, final, cfg)


def run_probe(run: TrainedRun, num_samples: int, seq_len: int, seed: int, bos: str, tokenizer=None) -> Probe:
    """``num_samples`` windows of ``seq_len`` tokens from the run's validation split, in its packing.

    ``bos``: ``auto`` = the run's packing; ``never`` = plain text windows (no inserted token);
    ``always`` = BOS then text.

    ``tokenizer``: the tokenizer saved in ``final/``; when given, the data prepared now must use the
    same vocabulary.

    Raises:
        InputError: the validation split has too few windows of that length, or the run's data no
            longer tokenizes with the vocabulary the model was saved with.
    """
    from sinklab.data.packing import make_packer
    from sinklab.data.probe import probe_set
    from sinklab.train.loop import _packing_context, prepare_data

    c = run.config
    tc = prepare_data(c, run.folder)
    saved = None if tokenizer is None else dict(tokenizer.get_vocab())
    if saved is not None and c.diffusion:  # a masked diffusion run's tokenizer has the mask token added
        from sinklab.diffusion.masking import MASK_TOKEN

        saved.pop(MASK_TOKEN, None)
    if saved is not None and tc.tokenizer.get_vocab() != saved:
        raise InputError(f"the data of {run.folder} prepared now has another vocabulary than the tokenizer in "
                         f"{run.final}; measure it with --input natural/random/repeated instead")
    packing = run.packing_for(bos)
    packer = make_packer(packing, _packing_context(c, tc))
    try:
        ids = probe_set(tc.val, packer, num_samples, seq_len, seed=seed, settings=("--num-samples", "--seq-len", None))
    except InputError as e:
        raise InputError(f"{e} (the validation split of the run {run.folder})") from None
    t = c.track
    details = {
        "run": str(run.folder), "data": run.data_name, "split": "validation", "packing": packing, "seed": seed,
        "tracker_probe": (num_samples, seq_len, seed, packing) == (t.n_probe, t.probe_len, t.seed, c.data.packing),
    }
    prefix = [int(tc.bos_id)] if packing == "bos" else []
    return Probe(ids, "run", bos, prefix, [], details)


def run_validation_documents(run: TrainedRun) -> list:
    """Token ids of every document of the run's validation split (its data prepared as for training),
    one (len_d,) array per document, in order."""
    from sinklab.train.loop import prepare_data

    val = prepare_data(run.config, run.folder).val
    return [val.doc(d) for d in range(val.n_docs)]


def check_input(run: TrainedRun, input: str, corpus: str | None) -> None:
    """Refuse inputs that mean nothing to the run's model.

    Raises:
        InputError: natural text for a model trained on a synthetic task.
    """
    if run.synthetic and input == "natural":
        raise InputError(
            f"{run.folder} was trained on the synthetic task {run.config.data.source!r}, so natural text "
            f"({'--corpus ' + corpus if corpus else 'a corpus'}) means nothing to it: measure it on its own held-out "
            "data (the default, --input run) or on --input random or repeated"
        )


def tokenizer_error(e: Exception, run: TrainedRun | None) -> SinklabError:
    """A one-line InputError for a tokenizer that cannot encode the probe text."""
    what = (f"this model's tokenizer (trained on {run.data_name}) cannot encode the input" if run is not None
            else "the model's tokenizer cannot encode the input")
    return InputError(f"{what}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
