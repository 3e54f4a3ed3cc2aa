"""Export a :class:`SinkLM` (or a ``sinklab train`` run) to a Hugging Face ``LlamaForCausalLM`` folder.

Only models whose parts map one-to-one onto LLaMA export: softmax attention with no
gate, RoPE, pre-norm RMSNorm, SwiGLU, no q/k/v biases, no sliding window. Weights
are copied by name; RoPE uses the same rotate-half layout, so no permutation is needed.

A run exports with its training settings checked (a prefix-LM run is refused: LLaMA's mask is
causal) and its input handling carried over: the exported tokenizer puts BOS first exactly when
the run's packing did, so the folder is fed what the run was trained on.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from sinklab.errors import ConfigError, InputError, param
from sinklab.nn.model import SinkLM


def unmappable_parts(config) -> list[str]:
    """Parts of ``config`` that ``LlamaForCausalLM`` cannot express (empty if it exports)."""
    bad = []
    if config.attention != "softmax" or config.attention_options.get("gate"):
        bad.append(f"attention={config.attention!r} options={config.attention_options} (LLaMA has plain softmax)")
    if config.positional != "rope":
        bad.append(f"positional={config.positional!r} (LLaMA uses rope)")
    if config.norm_position != "pre":
        bad.append(f"norm_position={config.norm_position!r} (LLaMA is pre-norm)")
    if config.norm != "rmsnorm":
        bad.append(f"norm={config.norm!r} (LLaMA uses rmsnorm)")
    if config.ffn != "swiglu":
        bad.append(f"ffn={config.ffn!r} (LLaMA uses swiglu)")
    if config.qkv_bias:
        bad.append("qkv_bias=true (LlamaForCausalLM export supports no attention biases)")
    if config.qk_norm:
        bad.append("qk_norm=true (LlamaForCausalLM has no query/key norm)")
    if config.sliding_window is not None:
        bad.append(f"sliding_window={config.sliding_window} (LLaMA has full attention)")
    if not getattr(config, "causal", True):
        bad.append("causal=false (a bidirectional masked diffusion model; LlamaForCausalLM is causal)")
    return bad


def special_token_ids(tokenizer) -> dict[str, int | None]:
    """``bos_token_id``, ``eos_token_id``, ``pad_token_id`` of ``tokenizer`` (None for a token it lacks,
    and all None without a tokenizer): what ``config.json`` and ``generation_config.json`` declare."""
    out = {}
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = None if tokenizer is None else getattr(tokenizer, name, None)
        out[name] = None if v is None else int(v)
    return out


def unmappable_training(run) -> list[str]:
    """Settings of the ``sinklab train`` run ``run`` (a :class:`~sinklab.runs.Run`) that made the model
    compute something ``LlamaForCausalLM`` cannot (empty if it exports): a prefix-LM mask."""
    bad = []
    if run.config.train.prefix_len:
        bad.append(f"{param('train.prefix_len', run.config.train.prefix_len)} (the model was trained as a prefix LM, "
                   "its first tokens attending to each other both ways; LlamaForCausalLM's mask is causal)")
    return bad


def llama_config(config, tokenizer=None):
    """The ``transformers.LlamaConfig`` with the same shapes as a :class:`ModelConfig`, and the special
    token ids of ``tokenizer`` (:func:`special_token_ids`; None, not LLaMA's defaults 1 / 2, for a
    token it lacks or without a tokenizer)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        **special_token_ids(tokenizer),
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        intermediate_size=config.d_ff,
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_seq_len,
        rms_norm_eps=config.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": float(config.rope_theta)},
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=config.tie_embeddings,
        initializer_range=config.init_std,
    )


def llama_state_dict(model: SinkLM) -> dict[str, torch.Tensor]:
    """SinkLM weights renamed to ``LlamaForCausalLM``'s parameter names."""
    sd = {"model.embed_tokens.weight": model.embed.weight, "model.norm.weight": model.final_norm.weight,
          "lm_head.weight": model.lm_head.weight}
    for i, blk in enumerate(model.layers):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = blk.attn_norm.weight
        sd[p + "post_attention_layernorm.weight"] = blk.ffn_norm.weight
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            sd[p + f"self_attn.{name}.weight"] = getattr(blk.attn, name).weight
        for name in ("gate_proj", "up_proj", "down_proj"):
            sd[p + f"mlp.{name}.weight"] = getattr(blk.ffn, name).weight
    return {k: v.detach().cpu().clone().contiguous() for k, v in sd.items()}


def _bos_template(folder: Path, tokenizer, add_bos: bool) -> None:
    """Make the tokenizer saved in ``folder`` put its BOS before every encoded text (``add_bos``) or add
    no special token, on every load: its ``tokenizer.json`` post-processor becomes a
    ``TemplateProcessing``, and ``tokenizer_config.json``'s ``add_bos_token`` / ``add_eos_token`` (where
    written) agree. Checked by loading it back.

    Raises:
        InputError: the tokenizer saved no ``tokenizer.json`` (not a fast tokenizer), or it still encodes
            otherwise once loaded back.
    """
    import json

    from tokenizers import Tokenizer, processors

    bos, bos_id = tokenizer.bos_token, tokenizer.bos_token_id
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise InputError(f"cannot set whether the exported tokenizer adds BOS: it saved no {path.name} "
                         "(a fast tokenizer is needed)")
    tok = Tokenizer.from_file(str(path))
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, int(bos_id))])
    else:
        tok.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1", special_tokens=[])
    tok.save(str(path))
    cfg_path = folder / "tokenizer_config.json"
    if cfg_path.is_file():
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        if "add_bos_token" in cfg or "add_eos_token" in cfg:  # a tokenizer class that rebuilds its template from them
            cfg.update(add_bos_token=bool(add_bos), add_eos_token=False)
            cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    from transformers import AutoTokenizer

    from sinklab.tokenizing import sample_encoding

    text, plain, full = sample_encoding(AutoTokenizer.from_pretrained(str(folder)))
    want = ([int(bos_id)] if add_bos else []) + list(plain)
    if list(full) != want:
        raise InputError(f"the exported tokenizer in {folder} encodes {text!r} as {list(full)} once loaded, "
                         f"not {want} ({'BOS first' if add_bos else 'no special token'})")


def export_hf(model, folder: str | os.PathLike, tokenizer=None, *, add_bos: bool | None = None) -> Path:
    """Write ``model`` as a ``LlamaForCausalLM`` folder (config.json, generation_config.json,
    model.safetensors, and the tokenizer's files when there is one).

    ``config.json`` and ``generation_config.json`` declare the tokenizer's own ``bos_token_id``,
    ``eos_token_id`` and ``pad_token_id`` (each None, never a guess, when the tokenizer lacks the token
    or none is given), so ``generate`` stops at the tokenizer's EOS.

    Args:
        model: a SinkLM whose parts map onto LLaMA (see :func:`unmappable_parts`), or a ``sinklab train``
            run (a :class:`sinklab.runs.Run`, e.g. ``Run.open("runs/NAME")``): its finished model, its
            tokenizer (unless ``tokenizer`` is given), its training settings checked
            (:func:`unmappable_training`) and its BOS handling carried over (``add_bos``). A SinkLM alone
            carries no training settings: pass the run to have them checked and carried over.
        folder: output folder (created).
        tokenizer: optional HF tokenizer (anything with ``save_pretrained``) saved beside it.
        add_bos: whether the exported tokenizer puts its BOS before every text it encodes (``True``) or
            adds no special token (``False``; both need a fast tokenizer); ``None``: for a run, ``True``
            exactly when its packing put BOS first in every training window (:attr:`Run.bos_policy
            <sinklab.runs.Run.bos_policy>` ``always``), so that ``sinklab measure`` on the folder feeds what
            measuring the run feeds; for a SinkLM, the tokenizer is saved as it is.

    Returns:
        the folder.

    Raises:
        ConfigError: naming every part that does not map onto LlamaForCausalLM (nothing is written).
        InputError: naming every training setting of the run that LlamaForCausalLM cannot reproduce
            (``train.prefix_len`` > 0; nothing is written); ``model`` is neither a SinkLM nor a run;
            ``add_bos`` without a tokenizer, or ``True`` for one with no BOS token (nothing is written);
            once the files are written, ``add_bos`` for a tokenizer that saves no ``tokenizer.json`` or
            still encodes otherwise once loaded back.
    """
    if not isinstance(model, SinkLM):
        # a Run, recognized by what export reads of it (sinklab.nn sits below sinklab.runs and does not import it)
        if not all(hasattr(model, a) for a in ("config", "folder", "bos_policy", "model", "tokenizer")):
            raise InputError(f"cannot export {model!r}: pass a sinklab.nn.SinkLM or a training run "
                             "(sinklab.runs.Run.open(folder))")
        run = model
        bad = unmappable_training(run)
        if bad:
            raise InputError(f"cannot export the run {run.folder} to LlamaForCausalLM: " + "; ".join(bad))
        model = run.model
        tokenizer = run.tokenizer if tokenizer is None else tokenizer
        if add_bos is None:
            add_bos = run.bos_policy == "always"
    bad = unmappable_parts(model.config)
    if bad:
        raise ConfigError("cannot export to LlamaForCausalLM: " + "; ".join(bad))
    if add_bos is not None and tokenizer is None:
        raise InputError(f"{param('add_bos', add_bos)} needs a tokenizer to export")
    if add_bos and getattr(tokenizer, "bos_token_id", None) is None:
        raise InputError(f"{param('add_bos', True)}: the tokenizer has no BOS token to put first")
    from transformers import LlamaForCausalLM

    folder = Path(folder)
    with torch.device("meta"):
        hf = LlamaForCausalLM(llama_config(model.config, tokenizer))
    hf.load_state_dict(llama_state_dict(model), strict=True, assign=True)
    if model.config.tie_embeddings:
        hf.tie_weights()
    hf.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
        if add_bos is not None:
            _bos_template(folder, tokenizer, add_bos)
    return folder
