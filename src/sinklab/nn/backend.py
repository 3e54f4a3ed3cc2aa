"""Which kernel computes an attention operation: ``model.attention_backend``.

The one place where an operation (a registered :class:`~sinklab.nn.ops.AttentionOp` class) is
matched to a backend; :class:`sinklab.nn.attention.Attention` asks :func:`resolve` once per forward
and :class:`sinklab.nn.ModelConfig` calls :func:`check_backend` when it is built::

    reference   the paths ``sdpa`` for the softmax family (``op.sdpa``), ``tile`` (the query-chunked
                tile loop with its analytic gradient, ``op.has_tile_grad``) or ``chunked``
                (checkpointed chunks) for the others (:data:`sinklab.nn.attention.ATTENTION_PATHS`).
                Serves every operation.
    flex        FlexAttention (:mod:`sinklab.nn.flex`): the softmax family (``op.sdpa``:
                softmax, softmax_scaled, sink_token, kv_bias, k_bias, v_bias, sink_logit,
                softmax_off_by_one, gated_headwise, gated_elementwise, diff).
    compiled    the tile loop with its per-tile forward and analytic backward under
                ``torch.compile`` (:mod:`sinklab.nn.compiled`): the operations with a tile gradient
                (``op.has_tile_grad``: sigmoid*, relu*, the kernels elu1* / linear*, softpick,
                softmax_pnorm), which FlexAttention cannot express (no softmax, or a normaliser
                other than the log-sum-exp).
    auto        (default) ``flex`` on CUDA for the operations it serves, ``reference`` elsewhere
                (on CPU, and for every other operation).

Observers (weights for the sink metric) and KV-cache decoding always use the reference formula (the
paths ``observed`` and ``cached``).
"""

from __future__ import annotations

from sinklab.errors import ConfigError

__all__ = ["BACKENDS", "served_by", "check_backend", "resolve"]

#: every value ``model.attention_backend`` accepts
BACKENDS = ("auto", "reference", "flex", "compiled")


def served_by(op_cls: type) -> tuple[str, ...]:
    """The backends (besides ``auto``) that compute operation class ``op_cls``, from its class
    attributes: ``reference`` always, ``flex`` iff ``op_cls.sdpa``, ``compiled`` iff
    ``op_cls.has_tile_grad``."""
    out = ["reference"]
    if op_cls.sdpa:
        out.append("flex")
    if op_cls.has_tile_grad:
        out.append("compiled")
    return tuple(out)


def _names(backend: str) -> list[str]:
    from sinklab.nn.ops import ATTENTION

    return [n for n in ATTENTION.names() if backend in served_by(ATTENTION.get(n))]


def check_backend(backend: object, attention: str, *, positional: str | None = None) -> None:
    """Raise :class:`ConfigError` unless ``backend`` (a ``model.attention_backend`` value) can
    compute operation ``attention`` (a registry name) with ``positional``.

    The message names the operation, the backends that serve it and the operations the requested
    backend serves."""
    from sinklab.nn.ops import ATTENTION

    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ConfigError(f"attention_backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r} "
                          f"(attention={attention!r}: {', '.join(map(repr, ('auto', *served_by(ATTENTION.get(attention)))))} "
                          "serve it)")
    if backend in ("auto", "reference"):
        return
    served = served_by(ATTENTION.get(attention))
    if backend not in served:
        raise ConfigError(
            f"attention_backend={backend!r} cannot compute attention={attention!r} "
            f"(backends for it: {', '.join(map(repr, ('auto', *served)))}); "
            f"{backend!r} serves: {', '.join(_names(backend))}")
    if backend == "compiled" and positional == "t5":
        raise ConfigError(
            "attention_backend='compiled' has no gradient for the learned T5 bias table (the tile "
            "gradient covers q, k, v only); use positional='alibi' / 'rope' / 'nope', or "
            "attention_backend='reference'")


def resolve(backend: str, op, device_type: str) -> str:
    """The backend that computes ``op`` (an operation instance) on ``device_type`` ("cpu",
    "cuda", ...): ``"reference"``, ``"flex"`` or ``"compiled"`` (``auto`` resolved; the pairing
    was checked by :func:`check_backend` when the config was built)."""
    if backend == "auto":
        return "flex" if device_type == "cuda" and type(op).sdpa else "reference"
    return backend
