"""The model's one flat, typed config.

:class:`ModelConfig` stores every component choice as a registry *name*
(``attention="sigmoid"``, ``positional="alibi"``, ``ffn="geglu"``), so a config
round-trips through JSON/TOML unchanged; :class:`sinklab.nn.SinkLM` resolves the
names when it is built. ``__post_init__`` checks every field and raises
:class:`~sinklab.errors.ConfigError` naming the field (or
:class:`~sinklab.errors.UnknownNameError` listing the valid names).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from sinklab.errors import ConfigError
from sinklab.registry import nearest


@dataclass(kw_only=True)
class ModelConfig:
    """Shape and parts of a decoder-only LLaMA-style :class:`~sinklab.nn.SinkLM`.

    Fields:
        vocab_size: number of token ids (embedding rows).
        d_model: width of the residual stream.
        n_layers: number of transformer blocks.
        n_heads: number of query heads; ``d_model % n_heads == 0``.
        n_kv_heads: number of key/value heads (grouped-query attention); None means
            ``n_heads``; must divide ``n_heads``.
        d_ff: hidden width of the feed-forward block.
        max_seq_len: longest sequence the model is trained for; a hard limit only for
            the table-based positional encodings (``learned``, ``sinusoidal``), and the
            ``n`` of ``sigmoid_logn``'s ``-log n`` bias.
        attention: name in :data:`sinklab.nn.ATTENTION` (``sinklab list attention``).
        attention_options: keyword options of that operation, e.g. ``{"alpha": 0.8}``
            for ``softmax_scaled``, ``{"p": 0.5}`` for ``softmax_pnorm``,
            ``{"gate": "headwise"}`` for any operation. Unknown options are errors.
        attention_backend: which kernel computes the attention (:mod:`sinklab.nn.backend`):
            ``"auto"`` (default: FlexAttention on CUDA for the softmax family, today's path
            elsewhere), ``"reference"`` (today's path: SDPA / the tile loop), ``"flex"``
            (FlexAttention, softmax family only) or ``"compiled"`` (the ``torch.compile``d tile
            loop, for the operations with a tile gradient). A pairing the backend cannot compute
            is a ConfigError naming the operation and the choices. Numerics only: checkpoints
            load under any backend.
        positional: name in :data:`sinklab.nn.POSITIONAL`.
        rope_theta: RoPE base (only used by ``rope``).
        t5_num_buckets, t5_max_distance: T5 relative-position buckets (``t5`` only).
        norm_position: ``"pre"`` (LLaMA: x + f(norm(x)), final norm before the head)
            or ``"post"`` (original Transformer: norm(x + f(x)), no final norm).
        norm: name in :data:`sinklab.nn.NORM` (``rmsnorm`` or ``layernorm``).
        norm_eps: epsilon inside the norm.
        ffn: name in :data:`sinklab.nn.FFN`.
        qkv_bias: add biases to the q/k/v projections (off in LLaMA).
        qk_norm: normalise every head's query and key with the model's ``norm`` over the
            head dimension (a learned (d_h,) weight each for q and k, shared by the heads)
            after the projections and before the positional encoding, as Qwen3 does
            (OLMo-2 normalises the whole q/k projection instead). Off in LLaMA.
        tie_embeddings: share the token embedding with the output head.
        sliding_window: attention width ``w`` (query i sees keys j with |i - j| < w),
            or None for full causal attention.
        causal: True (default): query i sees keys j <= i (a decoder LM; a prefix LM widens
            this per forward with ``prefix_len``). False: every query sees every key
            (bidirectional, as an encoder or a masked diffusion LM, LLaDA / MDLM); the
            forward's ``prefix_len`` is then ignored and a sliding window is symmetric.
        init_std: std of the normal init of every weight matrix; the two residual
            output projections (``o_proj``, ``down_proj``) use
            ``init_std / sqrt(2 * n_layers)`` (GPT-2 / nanoGPT).

    Raises:
        ConfigError: a field has a bad value or the parts do not combine; the
            message names the field.
        UnknownNameError: ``attention``/``positional``/``ffn``/``norm`` is not a
            registered name (the message lists the valid ones).
    """

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int | None = None
    d_ff: int
    max_seq_len: int
    attention: str = "softmax"
    attention_options: dict[str, Any] = field(default_factory=dict)
    attention_backend: str = "auto"
    positional: str = "rope"
    rope_theta: float = 10000.0
    t5_num_buckets: int = 32
    t5_max_distance: int = 128
    norm_position: str = "pre"
    norm: str = "rmsnorm"
    norm_eps: float = 1e-5
    ffn: str = "swiglu"
    qkv_bias: bool = False
    qk_norm: bool = False
    tie_embeddings: bool = False
    sliding_window: int | None = None
    init_std: float = 0.02
    causal: bool = True

    # ------------------------------------------------------------------ checks
    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len",
                     "t5_num_buckets", "t5_max_distance"):
            _positive_int(name, getattr(self, name))
        if self.n_kv_heads is not None:
            _positive_int("n_kv_heads", self.n_kv_heads)
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.n_heads % self.kv_heads:
            raise ConfigError(f"n_kv_heads={self.kv_heads} must divide n_heads={self.n_heads}")
        if self.sliding_window is not None:
            _positive_int("sliding_window", self.sliding_window)
        for name in ("rope_theta", "norm_eps", "init_std"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"{name} must be a positive number, got {v!r}")
        for name in ("qkv_bias", "qk_norm", "tie_embeddings", "causal"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.norm_position not in ("pre", "post"):
            raise ConfigError(f"norm_position must be 'pre' or 'post', got {self.norm_position!r}")
        if not isinstance(self.attention_options, dict):
            raise ConfigError(f"attention_options must be a table/dict, got {type(self.attention_options).__name__}")

        # Registry names (import here: the registries import this module's users).
        from sinklab.nn.ffn import FFN
        from sinklab.nn.norm import NORM
        from sinklab.nn.ops import ATTENTION, OpContext
        from sinklab.nn.positional import POSITIONAL

        op_cls = ATTENTION.get(self.attention)
        POSITIONAL.get(self.positional)
        FFN.get(self.ffn)
        NORM.get(self.norm)
        if self.positional == "t5":
            if self.t5_num_buckets < 4 or self.t5_num_buckets % 2:
                raise ConfigError(f"t5_num_buckets must be an even integer >= 4, got {self.t5_num_buckets}")
            if self.t5_max_distance <= self.t5_num_buckets // 4:
                raise ConfigError(f"t5_max_distance={self.t5_max_distance} must exceed t5_num_buckets // 4 "
                                  f"= {self.t5_num_buckets // 4} (the exact-distance buckets)")
        if self.positional == "rope" and self.qk_dim % 2:
            raise ConfigError(f"positional='rope' needs an even head dimension, got {self.qk_dim}"
                              + (" (half of d_model/n_heads: differential attention)" if self.qk_dim != self.head_dim
                                 else " (d_model/n_heads)"))
        # Build the operation once (a few parameters): its constructor validates its options.
        op = op_cls(self.op_context(), **_checked_options(op_cls, self.attention, self.attention_options))
        pos_cls = POSITIONAL.get(self.positional)
        if getattr(pos_cls, "logit_bias_kind", None) and not op.accepts_logit_bias:
            raise ConfigError(
                f"positional={self.positional!r} adds a bias to the attention logits q.k, but "
                f"attention={self.attention!r} computes its scores from feature maps phi(q).phi(k) "
                "with no logits to bias; use rope, nope, sinusoidal or learned positions with it"
            )
        from sinklab.nn.backend import check_backend

        check_backend(self.attention_backend, self.attention, positional=self.positional)
        del op, OpContext

    # --------------------------------------------------------------- derived
    @property
    def kv_heads(self) -> int:
        """Number of key/value heads (``n_kv_heads`` or ``n_heads``)."""
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        """Per-head width ``d_model // n_heads``."""
        return self.d_model // self.n_heads

    @property
    def qk_dim(self) -> int:
        """Width of the queries and keys one attention map uses (what RoPE rotates): ``head_dim``, or
        half of it for differential attention (two maps per head)."""
        from sinklab.nn.ops import ATTENTION

        return self.head_dim // 2 if getattr(ATTENTION.get(self.attention), "differential", False) else self.head_dim

    def op_context(self):
        """The shapes an attention operation is built with (:class:`sinklab.nn.ops.OpContext`)."""
        from sinklab.nn.ops import OpContext

        return OpContext(n_heads=self.n_heads, n_kv_heads=self.kv_heads, head_dim=self.head_dim,
                         d_model=self.d_model, max_seq_len=self.max_seq_len)

    # ---------------------------------------------------------- (de)serialise
    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every field (JSON/TOML-serialisable)."""
        d = dataclasses.asdict(self)
        d["attention_options"] = dict(self.attention_options)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        """Build from a dict; unknown keys raise ConfigError naming the nearest valid key."""
        valid = [f.name for f in dataclasses.fields(cls)]
        for key in data:
            if key not in valid:
                hint = nearest(key, valid)
                raise ConfigError(f"unknown model config key {key!r}" + (f" (did you mean {hint!r}?)" if hint else "")
                                  + f"; valid keys: {', '.join(valid)}")
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in data]
        if missing:
            raise ConfigError(f"model config is missing required key(s): {', '.join(missing)}")
        return cls(**data)


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _checked_options(op_cls: type, op_name: str, options: dict[str, Any]) -> dict[str, Any]:
    """Reject option names the operation's constructor does not take (ConfigError names them)."""
    allowed = op_cls.option_names()
    for key in options:
        if key not in allowed:
            hint = nearest(key, sorted(allowed))
            raise ConfigError(
                f"attention_options: {op_name!r} takes no option {key!r}"
                + (f" (did you mean {hint!r}?)" if hint else "")
                + f"; its options: {', '.join(sorted(allowed)) or '(none)'}"
            )
    return dict(options)
