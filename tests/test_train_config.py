"""Run configs: TOML round trip, unknown keys, overrides, incompatible combinations, presets."""

import tomllib

import pytest

from sinklab.errors import ConfigError, UnknownNameError
from sinklab.runs.config import (
    apply_overrides,
    diff_keys,
    from_dict,
    load_config,
    parse_override,
    presets,
    to_toml,
)
from sinklab.train.schedule import lr_at

BASE = {
    "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32},
    "data": {"corpus": ["a", "b"], "vocab_size": 300, "seq_len": 16},
    "train": {"steps": 10},
    "track": {"probe_len": 16, "positions": 4},
}


def test_defaults_fill_vocab_and_context_from_data():
    cfg = from_dict(BASE)
    assert cfg.model.vocab_size == 300 and cfg.model.max_seq_len == 16
    assert from_dict(apply_overrides(BASE, ["track.probe_len=32"])).model.max_seq_len == 32
    assert cfg.tokens_per_step == cfg.train.batch_size * 16


def test_round_trip_through_toml():
    raw = apply_overrides(BASE, ["model.attention=softmax_scaled", "model.attention_options.alpha=0.5",
                                 "model.sliding_window=8", "optim.decay=all", "data.packing=fixed_token",
                                 "data.packing_position=3", "track.probe_len=16"])
    cfg = from_dict(raw)
    text = to_toml(cfg)
    again = from_dict(tomllib.loads(text))
    assert again == cfg
    assert again.model.attention_options == {"alpha": 0.5}
    assert to_toml(again) == text


@pytest.mark.parametrize("section,key,hint", [("optim", "weight_decy", "weight_decay"),
                                              ("train", "batchsize", "batch_size"),
                                              ("data", "packng", "packing"),
                                              ("model", "d_modle", "d_model")])
def test_unknown_key_names_nearest(section, key, hint):
    raw = apply_overrides(BASE, [f"{section}.{key}=1"])
    with pytest.raises(ConfigError) as e:
        from_dict(raw)
    assert repr(key) in str(e.value) and repr(hint) in str(e.value)


def test_unknown_section_names_nearest():
    with pytest.raises(ConfigError, match="'optim'"):
        from_dict({**BASE, "optimm": {}})


def test_override_parsing():
    assert parse_override("optim.lr=3e-4") == (["optim", "lr"], 3e-4)
    assert parse_override("data.corpus=[\"sotu\", \"austen\"]") == (["data", "corpus"], ["sotu", "austen"])
    assert parse_override("model.attention=sigmoid") == (["model", "attention"], "sigmoid")  # bare word
    assert parse_override("train.compile=true") == (["train", "compile"], True)
    with pytest.raises(ConfigError):
        parse_override("lr=3")
    with pytest.raises(ConfigError):
        parse_override("optim.lr")


def test_bad_values_and_types():
    with pytest.raises(ConfigError, match="train.steps"):
        from_dict(apply_overrides(BASE, ["train.steps=\"many\""]))
    with pytest.raises(ConfigError, match="optim.decay"):
        from_dict(apply_overrides(BASE, ["optim.decay=some"]))
    with pytest.raises(UnknownNameError, match="concat"):
        from_dict(apply_overrides(BASE, ["data.packing=concatt"]))
    with pytest.raises(ConfigError, match="optim.schedule"):
        from_dict(apply_overrides(BASE, ["optim.schedule=linear"]))


@pytest.mark.parametrize("override, message", [
    ("train.seed=-1", r"^train.seed must be in \[0, 2\*\*32\), got -1$"),  # NumPy raised ValueError at the start
    ("train.seed=4294967296", r"^train.seed must be in \[0, 2\*\*32\)"),
    ("track.seed=-1", r"^track.seed must be in"),
    ("track.emerge_level=-5", r"^track.emerge_level .* \(0, 100\], got -5.0$"),  # reported 'reached -5.0% at step 5'
    ("track.emerge_level=150", r"^track.emerge_level .* \(0, 100\]"),  # could never be reached
    ("optim.lr=nan", r"^optim.lr must be a finite number, got nan$"),  # said "must be of type float"
    ("data.synthetic={vocab='x', n_triggers=2}", r"^data.synthetic.vocab must be an integer, got 'x'$"),  # TypeError
    ("data.synthetic={seed=-1}", r"^data.synthetic.seed must be in \[0, 2\*\*32\)"),
])
def test_out_of_range_values_are_one_line(override, message):
    synthetic = override.startswith("data.synthetic")
    base = apply_overrides(BASE, ['data.source="synthetic-bigram-backcopy"']) if synthetic else BASE
    with pytest.raises(ConfigError, match=message):
        from_dict(apply_overrides(base, [override]))


def test_incompatible_combinations_say_why():
    with pytest.raises(ConfigError, match="sink token"):
        from_dict(apply_overrides(BASE, ["model.attention=sink_token", "train.prefix_len=4"]))
    with pytest.raises(ConfigError, match="max_seq_len"):
        from_dict(apply_overrides(BASE, ["model.max_seq_len=8"]))
    with pytest.raises(ConfigError, match="prefix_len"):
        from_dict(apply_overrides(BASE, ["train.prefix_len=16"]))
    with pytest.raises(ConfigError, match="sliding_window"):
        from_dict(apply_overrides(BASE, ["train.prefix_len=8", "model.sliding_window=4"]))
    with pytest.raises(ConfigError, match="vocab_size"):
        from_dict(apply_overrides(BASE, ["model.vocab_size=100"]))
    with pytest.raises(ConfigError, match="packing_position"):
        from_dict(apply_overrides(BASE, ["data.packing=fixed_token", "data.packing_position=16"]))


def test_presets_load_with_paper_shapes():
    assert {"tiny-cpu", "paper-60m", "paper-1b"} <= set(presets())
    m60 = load_config("paper-60m").model
    assert (m60.n_layers, m60.n_heads, m60.d_model, m60.d_ff, m60.max_seq_len) == (10, 8, 768, 1536, 2048)
    m1b = load_config("paper-1b").model
    assert (m1b.n_layers, m1b.n_heads, m1b.d_model, m1b.d_ff, m1b.max_seq_len) == (22, 16, 2048, 5632, 2048)
    tiny = load_config("tiny-cpu", ["model.attention=sigmoid"])
    assert tiny.model.attention == "sigmoid" and tiny.model.d_model == 192
    with pytest.raises(ConfigError, match="tiny-cpu"):
        load_config("tiny-cpuu")


def test_file_based_on_preset(tmp_path):
    p = tmp_path / "wd.toml"
    p.write_text('preset = "tiny-cpu"\n[optim]\nweight_decay = 0.5\n')
    cfg = load_config(p)
    assert cfg.optim.weight_decay == 0.5 and cfg.model.n_layers == 4 and cfg.optim.lr == 1e-3


def test_diff_keys():
    a = from_dict(BASE).to_dict()
    b = from_dict(apply_overrides(BASE, ["optim.lr=0.5", "model.attention_options.alpha=0.5",
                                         "model.attention=softmax_scaled"])).to_dict()
    assert diff_keys(a, b) == ["model.attention", "model.attention_options", "optim.lr"]
    assert diff_keys(a, b, {"optim.lr", "model.attention", "model.attention_options"}) == []


def test_schedule_warmup_cosine_constant():
    cfg = from_dict(apply_overrides(BASE, ["optim.warmup_steps=4", "optim.lr=1.0", "optim.min_lr_ratio=0.1"]))
    o = cfg.optim
    assert [lr_at(s, o, 14) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(4, o, 14) == pytest.approx(1.0)
    assert lr_at(13, o, 14) == pytest.approx(0.1)
    mid = 4 + (13 - 4) / 2
    assert lr_at(int(mid), o, 14) < 1.0
    import math
    assert lr_at(7, o, 14) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 3 / 9)))
    const = from_dict(apply_overrides(BASE, ["optim.warmup_steps=2", "optim.schedule=constant"])).optim
    assert [lr_at(s, const, 10) for s in (0, 1, 2, 9)] == [const.lr / 2, const.lr, const.lr, const.lr]


# A config.toml as sinklab wrote it by hand before it used tomli_w (inline tables): runs saved then
# must still load, to the same config.
HAND_WRITTEN_CONFIG = """\
# sinklab run config (fully resolved)

[model]
vocab_size = 66
d_model = 64
n_layers = 4
n_heads = 4
d_ff = 256
max_seq_len = 64
attention = "softmax_scaled"
attention_options = {alpha = 0.5}
positional = "rope"
rope_theta = 10000.0
t5_num_buckets = 32
t5_max_distance = 128
norm_position = "pre"
norm = "rmsnorm"
norm_eps = 1e-05
ffn = "swiglu"
qkv_bias = false
tie_embeddings = false
sliding_window = 8
init_std = 0.02

[data]
corpus = "sotu"
tokenizer = "bpe"
vocab_size = 8192
seq_len = 64
packing = "bos"
packing_position = 0
packing_token = "<|bos|>"
max_train_tokens = 0
val_fraction = 0.05
split_seed = 0
cache_dir = ""
source = "synthetic-bigram-backcopy"
synthetic = {vocab = 64, n_triggers = 3, alpha = 0.5, n_train_docs = 50000, n_val_docs = 512}

[optim]
lr = 0.01
beta1 = 0.9
beta2 = 0.95
eps = 1e-08
weight_decay = 0.1
decay = "matrices"
schedule = "cosine"
warmup_steps = 50
min_lr_ratio = 0.1
grad_clip = 1.0

[train]
steps = 50
batch_size = 32
grad_accum = 1
seed = 0
device = "auto"
precision = "fp32"
compile = false
prefix_len = 0
log_every = 25
checkpoint_every = 200
tensorboard = false
threads = 1

[track]
every = 50
n_probe = 100
probe_len = 64
eps = 0.3
positions = 8
emerge_level = 10.0
val_windows = 64
seed = 0
batch_size = 16
"""
HAND_WRITTEN_OVERRIDES = ["model.attention=softmax_scaled", "model.attention_options.alpha=0.5",
                          "model.sliding_window=8", "train.steps=50"]


def test_config_toml_is_written_by_tomli_w():
    import tomli_w

    cfg = from_dict(apply_overrides(BASE, ["model.attention=softmax_scaled", "model.attention_options.alpha=0.5"]))
    text = to_toml(cfg)
    d = {s: {k: v for k, v in vals.items() if v is not None} for s, vals in cfg.to_dict().items()}
    assert text == "# sinklab run config (fully resolved)\n\n" + tomli_w.dumps(d)
    assert "[model.attention_options]\nalpha = 0.5\n" in text  # a table, where the hand-written text had {alpha = 0.5}
    assert from_dict(tomllib.loads(text)) == cfg


def test_tomli_w_is_a_declared_dependency():
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    assert any(dep.replace("-", "_").startswith("tomli_w") for dep in pyproject["project"]["dependencies"])


def test_hand_written_config_toml_still_loads(tmp_path):
    p = tmp_path / "config.toml"
    p.write_text(HAND_WRITTEN_CONFIG)
    old = load_config(p)
    assert old == load_config("emergence-cpu", HAND_WRITTEN_OVERRIDES)
    assert old.model.attention_options == {"alpha": 0.5} and old.data.synthetic["n_triggers"] == 3
    # rewritten by today's writer: other formatting, same config
    new_text = to_toml(old)
    assert new_text != HAND_WRITTEN_CONFIG
    p.write_text(new_text)
    assert load_config(p) == old
