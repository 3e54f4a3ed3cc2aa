"""SinkLM: one decoder-only LLaMA-style language model with registry-chosen parts.

Reads top to bottom: block, model, save/load. The parts come from the registries
named in :class:`~sinklab.nn.config.ModelConfig`: attention operation
(:mod:`sinklab.nn.ops`), positional encoding (:mod:`sinklab.nn.positional`), FFN
(:mod:`sinklab.nn.ffn`), norm (:mod:`sinklab.nn.norm`). Module names are stable:
``embed``, ``layers.{l}.attn_norm``, ``layers.{l}.attn.{q,k,v,o}_proj``,
``layers.{l}.attn.op``, ``layers.{l}.ffn_norm``, ``layers.{l}.ffn.{gate,up,down}_proj``,
``final_norm``, ``lm_head``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from sinklab.attention_masks import MaskSpec, document_positions
from sinklab.errors import ConfigError, InputError
from sinklab.fileio import atomic_write, atomic_write_text, check_safetensors, read_json, reading
from sinklab.nn.attention import Attention, AttentionOptions, AttnContext, Observer, bind_options
from sinklab.nn.config import ModelConfig
from sinklab.nn.ffn import FFN
from sinklab.nn.loss import linear_cross_entropy
from sinklab.nn.norm import NORM
from sinklab.nn.positional import POSITIONAL

CONFIG_FILE = "sinklab_model.json"
WEIGHTS_FILE = "model.safetensors"
FORMAT_VERSION = 1


@dataclass
class LMOutput:
    """Output of :meth:`SinkLM.forward`.

    logits: (B, T, V) next-token logits at every position; None when the forward was
        given ``targets`` (the loss is then computed without them).
    loss: 0-dim float32 mean next-token cross-entropy when ``targets`` were given, else None.
    hidden_states: None, or a tuple of n_layers + 1 tensors (B, T, d): the embedding
        output (absolute positions included) and the residual stream after each block,
        *before* the final norm (unlike HF, whose last entry is normed).
    """

    logits: Tensor | None
    hidden_states: tuple[Tensor, ...] | None = None
    loss: Tensor | None = None


class Block(nn.Module):
    """One transformer block.

    pre-norm (LLaMA):  x = x + attn(norm(x)); x = x + ffn(norm(x))
    post-norm (Vaswani et al. 2017): x = norm(x + attn(x)); x = norm(x + ffn(x))
    """

    def __init__(self, config: ModelConfig, layer_idx: int, attention_options: AttentionOptions | None = None) -> None:
        super().__init__()
        self.pre = config.norm_position == "pre"
        norm = NORM.get(config.norm)
        self.attn_norm = norm(config.d_model, config.norm_eps)
        self.attn = Attention(config, layer_idx, attention_options)
        self.ffn_norm = norm(config.d_model, config.norm_eps)
        self.ffn = FFN.get(config.ffn)(config.d_model, config.d_ff)

    def forward(self, x: Tensor, ctx: AttnContext, observer: Observer | None = None) -> Tensor:
        """x (B, T, d) -> (B, T, d)."""
        if self.pre:
            x = x + self.attn(self.attn_norm(x), ctx, observer)
            return x + self.ffn(self.ffn_norm(x))
        x = self.attn_norm(x + self.attn(x, ctx, observer))
        return self.ffn_norm(x + self.ffn(x))


class SinkLM(nn.Module):
    """Decoder-only LM: embeddings, ``n_layers`` blocks, (final norm), output head.

    Args:
        config: a validated :class:`ModelConfig`.
        attention_options: how every layer's attention computes (:class:`~sinklab.nn.attention.AttentionOptions`:
            speed and memory switches that leave the results equal); None = the defaults.

    Raises:
        ConfigError / UnknownNameError: from the config (validated again here).
    """

    def __init__(self, config: ModelConfig, attention_options: AttentionOptions | None = None) -> None:
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise ConfigError(f"SinkLM needs a ModelConfig, got {type(config).__name__}")
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.positional = POSITIONAL.get(config.positional)(config)
        self.layers = nn.ModuleList(Block(config, i, attention_options) for i in range(config.n_layers))
        self.final_norm = NORM.get(config.norm)(config.d_model, config.norm_eps) if config.norm_position == "pre" else None
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.reset_parameters()
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def set_attention_options(self, options: AttentionOptions | None = None, **changes: Any) -> AttentionOptions:
        """Give every layer's attention ``options`` (None: the first layer's current ones), with the
        fields in ``changes`` replaced (``model.set_attention_options(fused_qkv=False)``). Returns the
        options the layers had before (pass them back to restore). ``attention_backend=None``
        means the config's ``attention_backend`` (:func:`~sinklab.nn.attention.bind_options`).

        Raises:
            TypeError: an unknown field in ``changes``.
            ConfigError: an ``attention_backend`` that cannot compute the config's operation.
        """
        before = self.layers[0].attn.options
        new = bind_options(dataclasses.replace(before if options is None else options, **changes), self.config)
        for block in self.layers:
            block.attn.options = new
        return before

    def reset_parameters(self) -> None:
        """Normal(0, init_std) for every Linear/Embedding weight, init_std / sqrt(2 L) for
        the residual output projections (o_proj, down_proj), zeros for biases, ones for
        norm weights. Operation parameters keep their own init (see :mod:`sinklab.nn.ops`)."""
        std = self.config.init_std
        for name, m in self.named_modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                s = std / math.sqrt(2 * self.config.n_layers) if name.endswith(("o_proj", "down_proj")) else std
                nn.init.normal_(m.weight, 0.0, s)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Number of distinct parameters (tied weights counted once)."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.embed.weight.numel()
        return n

    def forward(
        self,
        input_ids: Tensor,
        *,
        prefix_len: int = 0,
        observer: Observer | None = None,
        output_hidden_states: bool = False,
        targets: Tensor | None = None,
        target_weights: Tensor | None = None,
        cache=None,
        document_ids: Tensor | None = None,
        restart_positions: bool = False,
    ) -> LMOutput:
        """Logits for every position.

        Args:
            input_ids: (B, T) token ids, int64, 0 <= id < vocab_size.
            prefix_len: length p of a bidirectional prefix (prefix LM): positions < p
                see each other; 0 (default) is plain causal. 0 <= p <= T. A model with
                ``config.causal = False`` (masked diffusion LM) always runs with p = T.
            observer: if given, called once per layer as ``observer(layer_idx, weights
                (B, H, T, T), *, renormalised, extra (B, H, T) | None, key (B, H_kv, T, d_h),
                value (B, H_kv, T, d_h))`` with 0-based layer index and positions. For
                operations whose rows do not sum to 1 (sigmoid/ReLU without
                normalisation, kernels, scaled or p-normalised softmax, softpick) the
                weights are renormalised to rows summing to 1 (virtual key included)
                and ``renormalised=True``, as the paper's own code does. ``extra`` is the
                weight on the virtual key (sink token, key bias, sink logit,
                softmax-off-by-one's implicit zero logit) or None. Keys are after RoPE.
                Every layer then uses its reference path (full T x T, one layer at a
                time); weights are not kept.
            output_hidden_states: also return the n_layers + 1 residual-stream states.
            targets: (B, T) int64 next-token ids (-100 = not counted): return the mean
                cross-entropy as ``loss`` from :func:`sinklab.nn.loss.linear_cross_entropy`
                (chunked, no (B, T, V) float32 logits) and ``logits=None``. For a masked
                diffusion model the targets are the clean ids at the masked positions.
            target_weights: (B, T) float weights of the targets (the loss is then
                ``sum w_i ce_i / n_counted``; the masked diffusion loss's 1/t), or None.
            cache: incremental decoding with a KV cache (:class:`sinklab.streaming.SinkCache` built
                for this model): the T tokens continue the stream the cache holds, at cache
                positions ``cache.kept_length() ..`` (StreamingLLM's positions inside the cache);
                relative positional encodings only (RoPE, ALiBi, T5 buckets, none); no prefix,
                observer or targets.
            document_ids: (B, T) integer document ids of packed windows (intra-document masking,
                :func:`sinklab.attention_masks.document_ids`): query i of row b then sees key j only
                if ``document_ids[b, i] == document_ids[b, j]``, on top of the causal / prefix /
                window rule, in every attention backend; virtual keys (sink token, biases, sink
                logits) stay visible to every query. Positions are not restarted (unless
                ``restart_positions``): a document's
                tokens keep their window positions 0..T-1 (RoPE, ALiBi and T5 depend on j - i
                only, so inside a document this changes nothing; learned / sinusoidal absolute
                positions differ from the document run alone). None (default): no document mask.
            restart_positions: with ``document_ids``: every document's tokens get positions 0, 1, ...
                (:func:`sinklab.attention_masks.document_positions`) in the absolute tables (learned,
                sinusoidal) and RoPE's rotations, so each document is computed as if alone; ALiBi and
                T5 biases depend on j - i only and need nothing. False (default): window positions.

        Returns:
            :class:`LMOutput`.

        Raises:
            InputError: bad ids, shape, prefix length, or T past the positional table; document ids
                that are not an integer (B, T) tensor, or given with a KV cache; ``restart_positions``
                without document ids.
        """
        if input_ids.dim() != 2 or input_ids.dtype not in (torch.int64, torch.int32):
            raise InputError(f"input_ids must be an integer tensor (B, T), got {input_ids.dtype} {tuple(input_ids.shape)}")
        B, T = input_ids.shape
        if T == 0 or B == 0:
            raise InputError(f"input_ids must be non-empty, got shape {tuple(input_ids.shape)}")
        if not 0 <= prefix_len <= T:
            raise InputError(f"prefix_len must be in [0, T={T}], got {prefix_len}")
        if document_ids is not None:
            if (document_ids.shape != input_ids.shape or document_ids.dtype.is_floating_point
                    or document_ids.dtype == torch.bool):
                raise InputError(f"document_ids must be an integer tensor of the shape of input_ids {tuple(input_ids.shape)}, "
                                 f"got {document_ids.dtype} {tuple(document_ids.shape)}")
            if cache is not None:
                raise InputError("document_ids cannot be combined with a KV cache (cache=): incremental decoding runs one stream")
            document_ids = document_ids.to(input_ids.device)
        elif restart_positions:
            raise InputError("restart_positions=True needs document_ids (positions restart at each document)")
        if cache is not None:
            return self._forward_cached(input_ids, cache)
        if not self.config.causal:
            prefix_len = T  # bidirectional model: every query sees every key
        self.positional.check_length(T)
        device = input_ids.device
        x = self.embed(input_ids)  # (B, T, d)
        absolute = self.positional.absolute(T, device)
        pos_state = self.positional.prepare(T, device)
        if restart_positions:  # each document at positions 0, 1, ...: rows of the tables for 0..T-1
            pos = document_positions(document_ids)  # (B, T)
            absolute = None if absolute is None else absolute[pos]  # (B, T, d)
            if isinstance(pos_state, tuple):  # RoPE's (cos, sin) (T, d_h) -> (B, 1, T, d_h)
                pos_state = tuple(t[pos][:, None] for t in pos_state)
        if absolute is not None:
            x = x + absolute.to(x.dtype)  # (T, d) broadcast over B, or (B, T, d)
        ctx = AttnContext(T=T, device=device, positional=self.positional,
                          mask=MaskSpec(prefix_len=prefix_len, window=self.config.sliding_window),
                          pos_state=pos_state, documents=document_ids)
        hidden = [x] if output_hidden_states else None
        for block in self.layers:
            x = block(x, ctx, observer)
            if hidden is not None:
                hidden.append(x)
        if self.final_norm is not None:
            x = self.final_norm(x)
        hidden_out = tuple(hidden) if hidden is not None else None
        if targets is not None:
            loss = linear_cross_entropy(x, self.lm_head.weight, targets, weights=target_weights)  # x (B, T, d), targets (B, T)
            return LMOutput(logits=None, hidden_states=hidden_out, loss=loss)
        logits = self.lm_head(x)  # (B, T, V)
        return LMOutput(logits=logits, hidden_states=hidden_out)

    def _forward_cached(self, input_ids: Tensor, cache) -> LMOutput:
        """Logits (B, T, V) of T new tokens after the tokens ``cache`` keeps (see :meth:`forward`)."""
        if not self.config.causal:
            raise InputError("a KV cache needs a causal model; this model is bidirectional (model.causal = false), "
                             "so every new token would change the earlier tokens' keys")
        if self.positional.absolute(1, input_ids.device) is not None:
            raise InputError(f"a KV cache needs relative positions; this model uses {self.config.positional!r} "
                             "absolute positions")
        B, T = input_ids.shape
        device = input_ids.device
        start = cache.kept_length()
        self.positional.check_length(start + T)
        state = self.positional.prepare(start + T, device)
        if isinstance(state, tuple):  # RoPE's (cos, sin) for positions start .. start + T - 1
            state = tuple(t[start:] for t in state)
        ctx = AttnContext(T=T, device=device, positional=self.positional, pos_state=state, kv_cache=cache,
                          position_ids=torch.arange(start, start + T, device=device)[None])
        x = self.embed(input_ids)
        for block in self.layers:
            x = block(x, ctx, None)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return LMOutput(logits=self.lm_head(x))

    # ------------------------------------------------------------ save / load
    def save_pretrained(self, folder: str | os.PathLike) -> Path:
        """Write ``sinklab_model.json`` (config) and ``model.safetensors`` into ``folder``.

        Each file is written to a temporary name in the folder and renamed into place,
        so an interrupted save leaves either the old file or the new one; the files get the
        mode a plain write would give (the umask's). Tied embeddings are stored once. Returns the folder.
        """
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        if self.config.tie_embeddings:
            state.pop("lm_head.weight", None)
        meta = {"format": "sinklab", "format_version": str(FORMAT_VERSION)}
        atomic_write(folder / WEIGHTS_FILE, lambda p: save_file(state, str(p), metadata=meta))
        cfg = {"format_version": FORMAT_VERSION, "model_type": "sinklab", "config": self.config.to_dict()}
        atomic_write_text(folder / CONFIG_FILE, json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        return folder

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike, *, map_location: str | torch.device = "cpu") -> "SinkLM":
        """Load a folder written by :meth:`save_pretrained`.

        Raises:
            InputError: the folder or a file is missing, or the weights do not match the config.
            CorruptFileError: ``sinklab_model.json`` or ``model.safetensors`` is garbage, truncated or
                unreadable (the message names the file).
            ConfigError: the stored config is invalid.
        """
        from safetensors.torch import load_file

        folder = Path(folder)
        cfg_path, w_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
        for p in (cfg_path, w_path):
            if not p.is_file():
                raise InputError(f"{p} not found: not a sinklab model folder (expected {CONFIG_FILE} and {WEIGHTS_FILE})")
        data = read_json(cfg_path, "sinklab model config")
        if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
            got = data.get("format_version") if isinstance(data, dict) else None
            raise InputError(f"{cfg_path}: unsupported format_version {got!r} (expected {FORMAT_VERSION})")
        with reading(cfg_path, "sinklab model config"):
            config = ModelConfig.from_dict(data["config"])
        model = cls(config)
        check_safetensors(w_path)
        with reading(w_path, "weights file"):
            state = load_file(str(w_path), device=str(map_location))
        if model.config.tie_embeddings and "embed.weight" in state:
            state["lm_head.weight"] = state["embed.weight"]
        with reading(w_path, "weights file", error=InputError, hint=f"the weights do not match {cfg_path.name}"):
            missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise InputError(f"{w_path} does not match its config: missing {missing}, unexpected {unexpected}")
        return model
