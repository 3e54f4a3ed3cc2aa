"""Pre-training: configs, learning-rate schedule, checkpoints, sink tracker and the training loop.

* :mod:`sinklab.train.config` -- TOML <-> dataclasses (model, data, optim, train, track), presets.
* :mod:`sinklab.train.schedule` -- warm-up + constant/cosine learning rate.
* :mod:`sinklab.train.checkpoint` -- atomic checkpoints (model, optimizer, RNG, data position).
* :mod:`sinklab.train.tracker` -- sink metrics on a fixed probe set during training.
* :mod:`sinklab.train.loop` -- :func:`train`, the loop itself.
"""
