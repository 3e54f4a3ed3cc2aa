"""Code structure: sinklab's modules import each other without cycles (each layer imports only
downwards), and the attention-mask helpers have one home shared by sinklab.nn and sinklab.capture."""

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
    from sinklab.attention_masks import build_mask, key_range

    want = _brute(t_q, t_k, prefix_len, window, causal)
    m = build_mask(t_q, t_k, prefix_len=prefix_len, window=window, causal=causal)
    assert m.tolist() == want
    for q0 in range(t_q):
        for q1 in range(q0 + 1, t_q + 1):
            k0, k1 = key_range(q0, q1, t_k, offset=t_k - t_q, prefix_len=prefix_len, window=window, causal=causal)
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
