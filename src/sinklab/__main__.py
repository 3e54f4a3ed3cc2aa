"""``python -m sinklab`` (and ``torchrun ... -m sinklab train ...``): the ``sinklab`` command."""

from sinklab.cli.main import app

if __name__ == "__main__":
    app()
