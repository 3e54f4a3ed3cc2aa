"""Code structure: sinklab's modules import each other in one direction, layer by layer, without cycles,
features never import each other, and the attention-mask helpers have one home shared by sinklab.nn and
sinklab.capture.

The layers, lowest first (a module may import its own layer and the layers below it, never above)::

    core      errors, registry, paths, attention_masks (masks), provenance, fileio, progress, result, tokenizing
    models    nn (SinkLM), zoo (model and corpus recipes: what installs from the registries),
              models (load_model: zoo name, HF folder or hub id, sinklab model or run folder)
    capture   metrics, capture (collectors, the HF and SinkLM seams, the model adapter), hooks (named hooks)
    data      data (tokenizers, token files, packing), probe (probe inputs, the window cutter),
              diffusion (the masked-diffusion objective's masking and sampler)
    runs      runs (RunConfig, Run)
    subject   subject (Subject: model + tokenizer + adapter + device/dtype, and the ProbeSpec that builds its
              probe; every feature loads its model here)
    train     train (the training loop, tracker, checkpoints)
    features  measure, analyze, streaming, sweep: each imports the layers below, never another feature
    cli       cli, __main__
"""

import ast
import itertools
from pathlib import Path

import pytest
import torch

import sinklab

SRC = Path(sinklab.__file__).resolve().parent.parent  # .../src


def _modules() -> dict[str, Path]:
    out = {}
    for p in (SRC / "sinklab").rglob("*.py"):
        parts = list(p.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """sinklab modules that ``name`` imports anywhere in its file (top level, inside functions, under
    TYPE_CHECKING): any of them can close a cycle."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            submodules = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules]
            found.update(submodules)
            if not submodules or target in modules:
                found.add(target)
    return {m for m in found if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = itertools.count()

    def visit(v):
        index[v] = low[v] = next(counter)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


#: the layers, lowest first: (name, packages or modules); a module belongs to the longest prefix listed
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("sinklab", "sinklab.errors", "sinklab.registry", "sinklab.paths", "sinklab.attention_masks",
              "sinklab.provenance", "sinklab.fileio", "sinklab.progress", "sinklab.result", "sinklab.tokenizing")),
    ("models", ("sinklab.nn", "sinklab.zoo", "sinklab.models")),
    ("capture", ("sinklab.metrics", "sinklab.capture", "sinklab.hooks")),
    ("data", ("sinklab.data", "sinklab.probe", "sinklab.diffusion")),
    ("runs", ("sinklab.runs",)),
    ("subject", ("sinklab.subject",)),
    ("train", ("sinklab.train",)),
    ("features", ("sinklab.measure", "sinklab.analyze", "sinklab.streaming", "sinklab.sweep")),
    ("cli", ("sinklab.cli", "sinklab.__main__")),
]
#: the layer whose packages must not import each other
FEATURES = "features"


def _owner(module: str, layers=LAYERS) -> tuple[int, str] | None:
    """(layer index, the package or module of ``layers`` that owns ``module``): the longest matching prefix."""
    best = None
    for i, (_, owners) in enumerate(layers):
        for o in owners:
            inside = module == o or (module.startswith(o + ".") and o != "sinklab")  # the root: its __init__ alone
            if inside and (best is None or len(o) > len(best[1])):
                best = (i, o)
    return best


def layer_violations(graph: dict[str, set[str]], layers=LAYERS, features: str = FEATURES) -> list[str]:
    """Every import of ``graph`` (module -> modules it imports) that breaks the direction: a module that
    imports a higher layer, a feature that imports another feature, a module in no layer."""
    names = [n for n, _ in layers]
    out = []
    for a in sorted(graph):
        oa = _owner(a, layers)
        if oa is None:
            out.append(f"{a} is in no layer (add its package to LAYERS)")
            continue
        for b in sorted(graph[a]):
            ob = _owner(b, layers)
            if ob is None:
                out.append(f"{b} is in no layer (add its package to LAYERS)")
            elif ob[0] > oa[0]:
                out.append(f"{a} ({names[oa[0]]}) imports {b} ({names[ob[0]]}), a higher layer")
            elif ob[0] == oa[0] and names[oa[0]] == features and ob[1] != oa[1]:
                out.append(f"{a} imports {b}: features never import each other (move the shared code down)")
    return sorted(set(out))


def test_the_layer_checker_catches_a_downward_breaking_import(tmp_path):
    """The checker on a fake tree: an upward import, a feature importing another feature, an unknown
    package; and the same tree with those imports removed passes."""
    files = {
        "sinklab/nn/model.py": "from sinklab.train.loop import train\n",  # models -> train: upward
        "sinklab/measure/run.py": "def f():\n    from sinklab.analyze.common import run_model\n",  # feature -> feature
        "sinklab/runs/run.py": "from sinklab.capture import collect\nimport sinklab.errors\n",  # downward: fine
        "sinklab/train/loop.py": "from sinklab.runs import Run\n",
        "sinklab/analyze/common.py": "from sinklab.measure.run import measure\n",
        "sinklab/capture/__init__.py": "", "sinklab/errors.py": "", "sinklab/newpkg/x.py": "import sinklab.nn.model\n",
    }
    mods = {}
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        parts = list(Path(rel).with_suffix("").parts)
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    graph = {name: _imports(name, path, mods) for name, path in mods.items()}
    assert layer_violations(graph) == sorted([
        "sinklab.analyze.common imports sinklab.measure.run: features never import each other (move the shared code down)",
        "sinklab.measure.run imports sinklab.analyze.common: features never import each other (move the shared code down)",
        "sinklab.newpkg.x is in no layer (add its package to LAYERS)",
        "sinklab.nn.model (models) imports sinklab.train.loop (train), a higher layer",
    ])
    clean = {a: {b for b in bs if not (a.startswith(("sinklab.nn", "sinklab.measure", "sinklab.analyze")))}
             for a, bs in graph.items() if not a.startswith("sinklab.newpkg")}
    assert layer_violations(clean) == []
    # a feature may import its own package and everything below
    assert layer_violations({"sinklab.streaming.run": {"sinklab.streaming.harness", "sinklab.runs.run", "sinklab"}}) == []


def test_imports_go_down_the_layers_and_features_stay_apart():
    bad = layer_violations(_graph())
    assert not bad, "imports against the layer direction:\n" + "\n".join(bad)


def test_no_module_imports_another_packages_private_names():
    """``from sinklab.X.y import _name`` only inside the package sinklab.X (no borrowed private helpers)."""
    found = []
    for name, path in _modules().items():
        own = ".".join(name.split(".")[:2])
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("sinklab"):
                target = ".".join(node.module.split(".")[:2])
                private = [a.name for a in node.names if a.name.startswith("_")]
                if private and target != own:
                    found.append(f"{name} imports {private} from {node.module}")
    assert not found, found


def test_the_import_parser_sees_every_kind_of_import(tmp_path):
    mods = {"sinklab.a": tmp_path / "a.py", "sinklab.b": tmp_path / "b.py", "sinklab.c": tmp_path / "c.py",
            "sinklab.pkg": tmp_path / "pkg" / "__init__.py", "sinklab.pkg.d": tmp_path / "pkg" / "d.py"}
    mods["sinklab.a"].write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sinklab.b import X\n"
        "def f():\n    import sinklab.c\n    from sinklab.pkg import d\n")
    # `from PKG import SUB` runs PKG/__init__ too: both count
    assert _imports("sinklab.a", mods["sinklab.a"], mods) == {"sinklab.b", "sinklab.c", "sinklab.pkg", "sinklab.pkg.d"}
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles_between_modules():
    cycles = _cycles(_graph())
    assert not cycles, f"modules that import each other (directly or through others): {cycles}"


def test_no_import_cycles_between_subpackages():
    """sinklab.metrics below sinklab.capture below sinklab.measure, etc.: no two subpackages import each other."""
    pkg_graph: dict[str, set[str]] = {}
    for a, targets in _graph().items():
        pa = ".".join(a.split(".")[:2])
        for b in targets:
            pb = ".".join(b.split(".")[:2])
            if pa != pb:
                pkg_graph.setdefault(pa, set()).add(pb)
    cycles = _cycles(pkg_graph)
    assert not cycles, f"subpackages that import each other: {cycles}"


SHARED = ("repeat_kv", "build_mask", "key_range", "_key_range", "visible")


def test_mask_helpers_are_defined_once():
    """repeat_kv, build_mask and the key-range helper live in sinklab.attention_masks only."""
    where: dict[str, list[str]] = {n: [] for n in SHARED}
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in where:
                where[node.name].append(name)
    assert where == {"repeat_kv": ["sinklab.attention_masks"], "build_mask": ["sinklab.attention_masks"],
                     "key_range": ["sinklab.attention_masks"], "_key_range": [],
                     "visible": ["sinklab.attention_masks"]}

    import sinklab.attention_masks as am
    import sinklab.capture.blockwise as bw
    import sinklab.capture.collectors as col
    import sinklab.nn.attention as att

    assert att.build_mask is am.build_mask and att.visible is am.visible and att.repeat_kv is am.repeat_kv
    assert col.repeat_kv is am.repeat_kv and bw.repeat_kv is am.repeat_kv


def _brute(t_q, t_k, prefix_len, window, causal):
    off = t_k - t_q
    return [[(((j <= i + off) or (j < prefix_len)) if causal else True) and (window is None or abs(i + off - j) < window)
             for j in range(t_k)] for i in range(t_q)]


@pytest.mark.parametrize("t_q,t_k", [(6, 6), (3, 6), (1, 5)])
@pytest.mark.parametrize("prefix_len", [0, 2])
@pytest.mark.parametrize("window", [None, 1, 3])
@pytest.mark.parametrize("causal", [True, False])
def test_shared_mask_and_key_range_against_loops(t_q, t_k, prefix_len, window, causal):
    from sinklab.attention_masks import MaskSpec, build_mask, key_range

    want = _brute(t_q, t_k, prefix_len, window, causal)
    spec = MaskSpec(causal=causal, prefix_len=prefix_len, window=window)
    m = build_mask(t_q, t_k, spec)
    assert m.tolist() == want
    for q0 in range(t_q):
        for q1 in range(q0 + 1, t_q + 1):
            k0, k1 = key_range(q0, q1, t_k, spec, offset=t_k - t_q)
            seen = [j for i in range(q0, q1) for j in range(t_k) if want[i][j]]
            assert all(k0 <= j < k1 for j in seen), (q0, q1, k0, k1, seen)
            if causal and not prefix_len and seen:  # tight without a prefix
                assert (k0, k1) == (min(seen), max(seen) + 1)


def test_repeat_kv_groups_consecutive_query_heads():
    from sinklab.attention_masks import repeat_kv

    x = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).view(2, 3, 4, 5)
    torch.testing.assert_close(repeat_kv(x, 2), x.repeat_interleave(2, dim=1), rtol=0, atol=0)
    assert repeat_kv(x, 1) is x


def test_results_hold_no_plot_scripts():
    """Plots in results/ come from sinklab's own commands (`sinklab dynamics`, `sinklab report`), not from
    one-off scripts that repeat them (results/archive/tiny-cpu-real-text/make_plot.py did)."""
    root = SRC.parent
    if not (root / "results").is_dir():
        pytest.skip("no results/ folder next to src/")
    assert sorted(str(p.relative_to(root)) for p in (root / "results").rglob("*.py")) == []
    assert "sinklab dynamics" in (root / "results" / "archive" / "README.md").read_text()


def test_every_feature_loads_its_model_through_the_subject_layer():
    """One builder of "model + tokenizer + adapter + device/dtype + probe": sinklab.subject. measure, analyze and
    streaming import it; none of them calls the model loader (sinklab.models.load_model) or draws a probe
    (sinklab.probe.make_probe) itself; the zoo holds no loader."""
    graph = _graph()
    for feature in ("sinklab.measure", "sinklab.analyze", "sinklab.streaming"):
        mods = {m: deps for m, deps in graph.items() if m == feature or m.startswith(feature + ".")}
        assert any(d == "sinklab.subject" or d.startswith("sinklab.subject.") for deps in mods.values() for d in deps), feature
        for m, path in _modules().items():
            if m in mods:
                text = path.read_text(encoding="utf-8")
                assert "import load_model" not in text and "make_probe(" not in text, m
    zoo = "".join(p.read_text(encoding="utf-8") for m, p in _modules().items() if m.startswith("sinklab.zoo"))
    assert "def load_model" not in zoo and "def is_run_folder" not in zoo
