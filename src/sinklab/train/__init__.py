"""Pre-training: learning-rate schedule, checkpoints, sink tracker and the training loop.

The run's config (TOML <-> dataclasses, presets) is :mod:`sinklab.runs.config`; a run folder's data,
probe and model are rebuilt by :class:`sinklab.runs.Run`.

* :mod:`sinklab.train.schedule` -- warm-up + constant/cosine learning rate.
* :mod:`sinklab.train.checkpoint` -- atomic checkpoints (model, optimizer, RNG, data position).
* :mod:`sinklab.train.tracker` -- sink metrics on a fixed probe set during training.
* :mod:`sinklab.train.loop` -- :func:`train`, the loop itself.
"""
