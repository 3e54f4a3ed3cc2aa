"""Which ``transformers`` model types sinklab measures exactly, which it refuses, and why (one owner).

Every causal-LM model type that ``transformers`` registers
(``transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``), plus the bidirectional
encoders sinklab supports (:data:`ENCODERS`), has one status here:

* **exact** -- ``tests/test_architecture_matrix.py`` builds a tiny random model of the type from its own
  config class and checks that :func:`sinklab.capture.collect` gives, for every layer, head and key
  position, the attention mass (Gu et al. 2025, Eq. 2) of the model's own eager attention computed in
  float64, to 1e-5 (hybrid models on their attention blocks, numbered as in the full stack);
* **refused** -- :data:`REFUSED` gives a one-line reason, and :func:`check_measurable` (called by the HF
  model adapter before every capture) raises :class:`~sinklab.errors.InputError` with it.

A type in neither table (a newer ``transformers``) is measured through the generic seam, unchecked.

The same page gives each type's **SinkCache** status (:func:`sink_cache_status`, the check
:class:`sinklab.streaming.SinkCache` runs before it builds a cache): **exact** for the rotate-half RoPE
types of :data:`ROTATE_HALF_MODEL_TYPES` (``tests/test_sink_cache_families.py`` decodes each past
evictions against a fresh forward over the kept tokens), **refused** with the one-line message SinkCache
raises (learned absolute positions, ALiBi, interleaved RoPE, a position encoding the matrix does not check),
**not applicable** for types with no attention keys to cache and for encoders.
:func:`attention_features` reads what a type's attention has (GQA, MLA, sliding window, chunked, sink
logits, output gate, softcap, ALiBi, QK-norm) from its default config and the static sets below.
``python -m sinklab.capture.families > docs/models.md`` writes the page; ``tests/test_docs.py`` keeps it in
step.
"""

from __future__ import annotations

import sys

from sinklab.errors import InputError

#: bidirectional encoders sinklab supports (measured through ``AutoModel``, every query sees every key)
ENCODERS: tuple[str, ...] = ("bert", "roberta", "xlm-roberta", "electra", "distilbert")

_NO_ATTENTION = "no softmax attention layers (a state-space / recurrent model): nothing to measure"
_MULTIMODAL = ("a multimodal wrapper (its blocks sit under a text sub-config): load and measure its text model "
               "type instead")
_UNBUILT = "not verified: the architecture matrix cannot build a tiny model of this type offline ({})"

#: model type -> the one-line reason sinklab refuses to measure it
REFUSED: dict[str, str] = {
    # no attention at all
    "mamba": _NO_ATTENTION, "mamba2": _NO_ATTENTION, "falcon_mamba": _NO_ATTENTION, "rwkv": _NO_ATTENTION,
    "xlstm": _NO_ATTENTION,
    # multimodal wrappers: the config's blocks are in a text sub-config
    "gemma3": _MULTIMODAL, "gemma3n": _MULTIMODAL, "gemma4": _MULTIMODAL, "gemma4_unified": _MULTIMODAL,
    "gemma4_unified_assistant": _MULTIMODAL, "fuyu": _MULTIMODAL, "got_ocr2": _MULTIMODAL, "llama4": _MULTIMODAL,
    "emu3": _MULTIMODAL, "qwen3_5": _MULTIMODAL, "qwen3_5_moe": _MULTIMODAL, "qwen4_exp": _MULTIMODAL,
    "moss_transcribe_diarize": _MULTIMODAL, "musicgen": _MULTIMODAL, "musicgen_melody": _MULTIMODAL,
    "blt": "byte-level patches: its blocks sit in local encoder/decoder and global sub-models, not one stack",
    "git": "an image-text decoder: the capture records no hidden state for some of its blocks",
    # capture seam failures found by the matrix that are not fixed: refused rather than wrong
    "bigbird_pegasus": ("its decoder self-attention is built with is_causal=False, so transformers' own SDPA path "
                        "(and sinklab's seam, which follows it) attends bidirectionally when the causal mask is "
                        "skipped, unlike its eager path"),
    "inkling_text": "its layers differ in query-head count (64 vs 4 at two layers): per-layer tables cannot hold it",
    "inkling2_text": "its layers differ in query-head count (48 vs 4 at two layers): per-layer tables cannot hold it",
    "inkling2_loop_text": ("its layers differ in query-head count (24 vs 4 at two layers): per-layer tables cannot "
                           "hold it"),
    "mimo_v2_flash": "its layers differ in query-head count (2 vs 4 at two layers): per-layer tables cannot hold it",
    "minimax": "one layer's capture sees fewer keys than tokens (its lightning-attention hybrid): not exact",
    "deepseek_v4": "the capture fails on it (its attention returns three values): not checked",
    "hy_v4": "the capture fails on it (its attention returns three values): not checked",
    "longcat_flash": "the capture finds no list of its num_hidden_layers blocks",
    "hrm_text": "the capture finds no list of its num_hidden_layers blocks",
    "olmo_hybrid": ("its full-attention block is not intercepted and the eager fallback cannot number a hybrid's "
                    "blocks: the capture fails on it"),
    "dory": "the capture fails on it (attention calls outnumber its recorded blocks): not checked",
    "zamba2": "the capture fails on it (a KeyError on its shared attention blocks): not checked",
    "granitemoehybrid": ("the capture fails on it (its attention calls do not match its attention blocks and its "
                         "eager path returns no weights): not checked"),
    "kimi_linear": ("its full-attention block is not intercepted and the eager fallback cannot number a hybrid's "
                    "blocks: the capture fails on it"),
    "bailing_hybrid": ("its full-attention block is not intercepted and the eager fallback cannot number a hybrid's "
                       "blocks: the capture fails on it"),
    "xmod": "needs a language adapter chosen per input (set_default_language); sinklab passes token ids only",
}

#: types whose tiny model the matrix cannot build offline (config validation or missing packages): refused
_UNBUILT_TYPES: dict[str, str] = {
    "zamba": "shared-transformer weight tying fails at two layers",
    "cohere_compass_text": "its layer types lack a mask",
    "dbrx": "nested attention config",
    "dots3_note": "head-count validation", "dots3_note_text": "head-count validation",
    "gemma3n_text": "KV-sharing layer pattern", "gemma4_assistant": "per-layer input size validation",
    "kolibri1_1": "NVFP4 key rounding needs head_dim 16", "lfm2_moe": "dense-layer pattern",
    "qwen4_exp_text": "derived head sizes", "reformer": "LSH attention needs is_decoder and chunk sizes",
}
REFUSED.update({t: _UNBUILT.format(why) for t, why in _UNBUILT_TYPES.items()})

#: SinkCache (:mod:`sinklab.streaming`): model types whose attention applies RoPE with ``rotate_half`` to the
#: first rotary_dim dims; each is checked by ``tests/test_sink_cache_families.py``
ROTATE_HALF_MODEL_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3",
    "gemma3_text", "phi", "phi3", "stablelm", "olmo", "olmo2", "granite", "smollm3", "starcoder2", "gpt_neox",
    "gpt_oss",  # writes rotate-half as two halves: first * cos - second * sin, second * cos + first * sin
})
#: model types whose RoPE rotates interleaved pairs (dims 2i, 2i+1: GLM-4, Helium): SinkCache refuses them
INTERLEAVED_MODEL_TYPES = frozenset({"glm", "glm4", "helium"})
_LEARNED = ("learned absolute position embeddings, which are baked into the hidden states, so positions cannot be "
            "reassigned inside the cache")
_ALIBI = ("ALiBi, a distance bias inside attention; StreamingLLM gives ALiBi models contiguous biases over the cache, "
          "which this cache does not implement")
#: model types with learned absolute positions or ALiBi: keys carry no rotation a cache could move
NO_ROPE_MODEL_TYPES = {"gpt2": _LEARNED, "opt": _LEARNED, "gpt_bigcode": _LEARNED, "bloom": _ALIBI, "mpt": _ALIBI}

#: types whose attention adds learned per-head sink logits to the softmax denominator (a virtual sink)
SINK_LOGIT_TYPES = frozenset({"gpt_oss", "granite_swa", "granitemoe_swa", "flint"})
#: types whose softmax attention output is multiplied by a sigmoid gate (read from the modeling code)
GATED_TYPES = frozenset({"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "qwen4_exp_text", "lfm3", "beam",
                         "axk2", "dots3_note_text", "hy_v4", "afmoe", "minicpm5_moe"})
#: types with RMS/LayerNorm on queries and keys per head whatever the config says (Qwen3, OLMo-2 ...)
QK_NORM_TYPES = frozenset({"qwen3", "qwen3_moe", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "olmo2", "olmo3",
                           "olmoe", "flex_olmo", "gemma3_text", "gemma3n_text", "gemma4_text", "dots1", "exaone4",
                           "smollm3", "ministral3", "apertus", "apertus1p5_text", "seed_oss", "glm4_moe"})
#: types with ALiBi position biases (BLOOM, MPT; Falcon when its config says so)
ALIBI_TYPES = frozenset({"bloom", "mpt"})


def status(model_type: str) -> str:
    """``"refused"``, or ``"exact"`` (checked by the matrix) for every registered type not refused, or
    ``"unchecked"`` for a type ``transformers`` does not register (as causal LM or supported encoder)."""
    if model_type in REFUSED:
        return "refused"
    return "exact" if model_type in registered_types() else "unchecked"


def registered_types() -> list[str]:
    """Every causal-LM model type ``transformers`` registers, then :data:`ENCODERS` not among them."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    causal = list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    return causal + [t for t in ENCODERS if t not in causal]


def sink_cache_status(model_type: str) -> tuple[str, str]:
    """What :class:`sinklab.streaming.SinkCache` does with a model of ``model_type`` (the type of its text
    config for a multimodal wrapper, as SinkCache reads it): ``("exact", "")`` for
    :data:`ROTATE_HALF_MODEL_TYPES`; ``("not applicable", why)`` for a type with no softmax attention (nothing
    to cache) or an encoder (:data:`ENCODERS`: nothing is decoded); ``("refused", message)`` otherwise, with
    the one-line :class:`~sinklab.errors.InputError` message SinkCache raises (:func:`check_sink_cache`)."""
    mt = model_type
    if mt in ROTATE_HALF_MODEL_TYPES:
        return "exact", ""
    if REFUSED.get(mt) == _NO_ATTENTION:
        return "not applicable", f"SinkCache does not apply to model type {mt!r}: it has no attention keys to cache"
    if mt in ENCODERS:
        return "not applicable", f"SinkCache does not apply to model type {mt!r}: an encoder, nothing is decoded"
    if mt in NO_ROPE_MODEL_TYPES:
        return "refused", f"SinkCache needs a RoPE model: {mt} uses {NO_ROPE_MODEL_TYPES[mt]}"
    if mt in INTERLEAVED_MODEL_TYPES:
        return "refused", (f"SinkCache does not support model type {mt!r}: its RoPE interleaves pairs of dimensions "
                           "(2i, 2i+1), which the cache's re-rotation (rotate-half) would move wrongly")
    return "refused", (f"SinkCache does not support model type {mt!r}: its position encoding is not one the "
                       "sink-cache matrix checks (rotate-half RoPE), so moving its keys is not verified")


def check_sink_cache(config) -> None:
    """Raise unless :func:`sink_cache_status` of the model type of ``config``'s text config is exact.

    Raises:
        InputError: the type is refused or not applicable; the message is :func:`sink_cache_status`'s.
    """
    cfg = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    st, why = sink_cache_status(getattr(cfg, "model_type", "?"))
    if st != "exact":
        raise InputError(why)


def _text_type(model_type: str, config) -> str:
    """The model type SinkCache reads for a registered type: its default config's text config's type."""
    try:
        return config.get_text_config(decoder=True).model_type
    except Exception:  # noqa: BLE001 - no config, or a wrapper without one text config
        return model_type


def registered_sink_cache_status(model_type: str, config=None) -> tuple[str, str]:
    """:func:`sink_cache_status` of a registered type as SinkCache meets it: of the type of its text config
    (``config``, default the type's default config), so a multimodal wrapper around a rotate-half language model
    (Gemma 3, GOT-OCR2 around Qwen2) is exact."""
    return sink_cache_status(_text_type(model_type, config if config is not None else _default_config(model_type)))


def sink_cache_types() -> list[str]:
    """The registered types whose SinkCache status is exact (:func:`registered_sink_cache_status`): the types
    ``tests/test_sink_cache_families.py`` decodes past evictions, and the exact rows of ``docs/models.md``."""
    return [t for t in registered_types() if registered_sink_cache_status(t)[0] == "exact"]


def check_measurable(config) -> None:
    """Raise if sinklab refuses to measure models of ``config.model_type``.

    Raises:
        InputError: the type is in :data:`REFUSED`; the message is its one-line reason.
    """
    model_type = getattr(config, "model_type", "")
    if model_type in REFUSED:
        raise InputError(f"sinklab does not measure {model_type!r} models: {REFUSED[model_type]}")


def _default_config(model_type: str):
    """The type's default config, or None when it cannot be built without arguments."""
    try:
        from transformers import CONFIG_MAPPING

        return CONFIG_MAPPING[model_type]()
    except Exception:  # noqa: BLE001 - a config that needs arguments
        return None


def attention_features(model_type: str, config=None) -> list[str]:
    """What the attention of ``model_type`` has, read from ``config`` (default: the type's default
    config) and the static sets above: ``GQA`` / ``MQA`` (fewer key/value heads than query heads),
    ``MLA`` (low-rank compressed keys/values), ``sliding window``, ``chunked``, ``sink logits``, ``gate``,
    ``softcap``, ``ALiBi``, ``QK-norm``. A config that cannot be built gives only the static features."""
    if config is None:
        config = _default_config(model_type)  # None: static features only
    out: list[str] = []
    try:
        cfg = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config
    except Exception:  # noqa: BLE001 - a wrapper without one text config
        cfg = config

    def get(name, default=None):
        try:
            return getattr(cfg, name, default) if cfg is not None else default
        except Exception:  # noqa: BLE001 - a per-layer attribute (heterogeneous configs) has no single value
            return default

    heads, kv = get("num_attention_heads"), get("num_key_value_heads")
    if get("kv_lora_rank"):
        out.append("MLA")
    elif get("multi_query") or (isinstance(heads, int) and isinstance(kv, int) and kv == 1 < heads):
        out.append("MQA")
    elif isinstance(heads, int) and isinstance(kv, int) and 1 < kv < heads:
        out.append("GQA")
    layer_types = get("layer_types") or []
    window = get("sliding_window") or get("window_size")
    if (window and (get("use_sliding_window", True) is not False)) or "sliding_attention" in layer_types:
        out.append("sliding window")
    if get("attention_chunk_size") or "chunked_attention" in layer_types:
        out.append("chunked")
    if model_type in SINK_LOGIT_TYPES:
        out.append("sink logits")
    if model_type in GATED_TYPES:
        out.append("gate")
    if get("attn_logit_softcapping"):
        out.append("softcap")
    attn_config = get("attn_config")
    if model_type in ALIBI_TYPES or get("alibi") or get("position_embedding_type") == "alibi" or (
            getattr(attn_config, "alibi", False)):
        out.append("ALiBi")
    if model_type in QK_NORM_TYPES or get("use_qk_norm") or get("qk_layernorm") or get("qk_norm"):
        out.append("QK-norm")
    return out


def refusal_kind(reason: str) -> str:
    """The kind of a :data:`REFUSED` reason, for the counts on the page: ``no attention``, ``multimodal
    wrapper``, ``not buildable offline`` or ``capture not exact`` (a seam failure the matrix found)."""
    if reason == _NO_ATTENTION:
        return "no attention"
    if reason == _MULTIMODAL:
        return "multimodal wrapper"
    if reason.startswith(_UNBUILT.split("(")[0]):
        return "not buildable offline"
    return "capture not exact"


def sink_cache_kind(status_reason: tuple[str, str]) -> str:
    """The kind of a :func:`sink_cache_status`, for the counts on the page: ``exact``, ``not applicable``, or
    ``refused: learned positions`` / ``ALiBi`` / ``interleaved RoPE`` / ``positions not checked``."""
    st, why = status_reason
    if st != "refused":
        return st
    if "learned absolute" in why:
        return "refused: learned positions"
    if "ALiBi" in why:
        return "refused: ALiBi"
    if "interleaves" in why:
        return "refused: interleaved RoPE"
    return "refused: positions not checked"


def _counts(kinds: list[str]) -> str:
    order = list(dict.fromkeys(sorted(kinds)))
    return ", ".join(f"{k} {kinds.count(k)}" for k in order)


def render() -> str:
    """The Markdown page ``docs/models.md``: every type of :func:`registered_types` with its measure status,
    its attention's features, the reason for a refused type, and its SinkCache status
    (:func:`sink_cache_status` of the type SinkCache reads: a wrapper's text config type), with the counts by
    kind of reason."""
    import transformers

    types = registered_types()
    refused = [t for t in types if t in REFUSED]
    configs = {t: _default_config(t) for t in types}
    cache = {t: registered_sink_cache_status(t, configs[t]) for t in types}
    cache_kinds = [sink_cache_kind(cache[t]) for t in types]
    lines = [
        "# Model types",
        "",
        "Generated by `python -m sinklab.capture.families > docs/models.md` from `sinklab/capture/families.py`",
        f"and transformers {transformers.__version__}; `tests/test_docs.py` checks it is in step.",
        "",
        "**exact**: `tests/test_architecture_matrix.py` builds a tiny random model of the type (2 layers, hidden "
        "size 32, T = 16) from its own config class and checks that `sinklab.capture.collect` gives the attention "
        "mass of the model's own eager attention in float64 on every layer, head and key position, to 1e-5 "
        "(hybrids on their attention blocks, numbered as in the full stack). **refused**: sinklab raises an "
        "`InputError` with the reason given. Features are read from the type's default config (GQA / MQA / MLA, "
        "sliding window, chunked, softcap, ALiBi, QK-norm where the config says so) and from hand-kept lists of "
        "what modeling code does without a config switch (sink logits in the softmax denominator: "
        "`SINK_LOGIT_TYPES`; a sigmoid gate on the attention output: `GATED_TYPES`; QK-norm: `QK_NORM_TYPES`, "
        "which does not yet list every type that always normalises queries and keys). Sink logits are reported as the virtual sink (`extra_mass`, "
        "`sink_rate_virtual` in `results.json`); the gated types sinklab reads the gate of "
        f"({', '.join(f'`{t}`' for t in _gated_readers())}) also get the gate-weighted attention "
        "(`attention_mass_gated`, `sink_rate_gated`).",
        "",
        "**SinkCache** (`sinklab.streaming.SinkCache`, the type SinkCache reads: a multimodal wrapper's text "
        "config type): **exact**: `tests/test_sink_cache_families.py` decodes a one-layer model of the type past "
        "several evictions and checks it against a fresh forward over exactly the kept tokens; **refused**: "
        "SinkCache raises an `InputError` with the message given; **not applicable**: no attention keys to "
        "cache, or an encoder.",
        "",
        f"{len(types)} types: {len(types) - len(refused)} exact, {len(refused)} refused "
        f"({_counts([refusal_kind(REFUSED[t]) for t in refused])}). The encoders sinklab "
        f"supports ({', '.join(ENCODERS)}) are checked bidirectionally: through their causal-LM class where "
        "transformers registers one (without `is_decoder` it attends both ways), else through `AutoModel`.",
        "",
        f"SinkCache: {_counts(cache_kinds)}.",
        "",
        "| model type | status | attention | reason | SinkCache |",
        "|---|---|---|---|---|",
    ]
    for t in types:
        feats = ", ".join(attention_features(t, configs[t])) or "-"
        st, why = cache[t]
        lines.append(f"| `{t}` | {status(t)} | {feats} | {REFUSED.get(t, '')} | {st + (': ' + why if why else '')} |")
    return "\n".join(lines) + "\n"


def _gated_readers() -> list[str]:
    from sinklab.capture.gates import GATES

    return sorted(GATES.names())


if __name__ == "__main__":
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    sys.stdout.write(render())
