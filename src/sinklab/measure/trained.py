"""Measuring a model trained by ``sinklab train``: the checks ``sinklab measure`` makes on its inputs.

The run itself (its folder, config, data and probe) is :class:`sinklab.runs.Run`. The default probe
of such a model (``--input auto`` resolves to ``run``) is what the run's sink tracker measured:
:meth:`sinklab.runs.Run.probe` on the validation split of the run's data (synthetic task or real
text, prepared exactly as for training), in the run's packing (BOS or not), with the tracker's size
and seed unless ``--num-samples``/``--seq-len``/``--seed`` say otherwise.
"""

from __future__ import annotations

from sinklab.errors import InputError, SinklabError, param
from sinklab.runs import Run


def check_input(run: Run, input: str, corpus: str | None) -> None:
    """Refuse inputs that mean nothing to the run's model.

    Raises:
        InputError: natural text for a model trained on a synthetic task.
    """
    if run.synthetic and input == "natural":
        raise InputError(
            f"{run.folder} was trained on the synthetic task {run.config.data.source!r}, so natural text "
            f"({param('corpus', corpus) if corpus else 'a corpus'}) means nothing to it: measure it on its own held-out "
            f"data (the default, {param('input', 'run')}) or on {param('input', 'random')} or repeated"
        )


def tokenizer_error(e: Exception, run: Run | None) -> SinklabError:
    """A one-line InputError for a tokenizer that cannot encode the probe text."""
    what = (f"this model's tokenizer (trained on {run.data_name}) cannot encode the input" if run is not None
            else "the model's tokenizer cannot encode the input")
    return InputError(f"{what}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
