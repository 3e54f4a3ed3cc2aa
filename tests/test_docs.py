"""The docs cannot drift from the code: the CLI reference is the generator's output,
every example command parses with the current CLI, the README stays one screen, and no commit hash,
machine-load figure or issue number sits outside the results files."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
#: the pages the README links and issue 20 asks for
REQUIRED = ["README.md", "install.md", "concepts.md", "measure.md", "train.md", "studies.md", "streaming.md",
            "analyze.md", "diffusion.md", "scaling.md", "api.md", "cli.md", "models.md"]


def _root():
    import typer.main

    from sinklab.cli.main import _load_commands, cli

    _load_commands()
    return typer.main.get_command(cli)


def test_cli_reference_is_the_generators_output():
    from sinklab.cli.docs import render

    committed = (DOCS / "cli.md").read_text(encoding="utf-8")
    assert committed == render(), "docs/cli.md is stale: run `python -m sinklab.cli.docs > docs/cli.md`"


def test_models_page_is_the_generators_output():
    from sinklab.capture.families import render

    committed = (DOCS / "models.md").read_text(encoding="utf-8")
    assert committed == render(), "docs/models.md is stale: run `python -m sinklab.capture.families > docs/models.md`"


def test_cli_reference_names_every_command_and_option():
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    root = _root()

    from sinklab.cli.docs import subcommands

    def walk(path, cmd):
        subs = subcommands(cmd)
        if subs:
            for n, sub in subs.items():
                walk([*path, n], sub)
            return
        assert f"## `{' '.join(path)}`" in text, path
        for p in cmd.params:
            for o in p.opts:
                if o.startswith("-"):
                    assert f"`{o}`" in text, (path, o)

    for n, c in subcommands(root).items():
        walk(["sinklab", n], c)


def test_pages_exist_and_readme_is_one_screen():
    assert sorted(p.name for p in DOCS.glob("*.md")) == sorted(REQUIRED)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    assert "make demo" in readme and "make test" in readme
    for m in re.finditer(r"!\[[^\]]*\]\(([^)]+)\)", readme):  # the headline figure exists
        assert (REPO / m.group(1)).is_file(), m.group(1)


def test_relative_links_resolve():
    for page in PAGES:
        for m in re.finditer(r"\]\(([^)#]+)(#[^)]*)?\)", page.read_text(encoding="utf-8")):
            target = m.group(1)
            if "://" in target:
                continue
            assert (page.parent / target).exists(), (page.name, target)


#: what belongs in results/ and benchmarks/ only: commit hashes, machine-load figures, issue numbers
FORBIDDEN = [
    (re.compile(r"\b[0-9a-f]{12,}\b"), "a 12+ hex-digit hash"),
    (re.compile(r"(?<![0-9a-fA-F])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,11}(?![0-9a-fA-F])"), "a short commit hash"),
    (re.compile(r"load average|load of", re.I), "a machine-load figure"),
    (re.compile(r"\bissues? #?[1-9][0-9]?\b", re.I), "an issue number"),
]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_hashes_loads_or_issue_numbers(page):
    text = page.read_text(encoding="utf-8")
    found = [(why, m.group(0)) for rx, why in FORBIDDEN for m in rx.finditer(text)]
    assert found == [], f"{page.name}: {found}"


def test_the_forbidden_patterns_catch_what_they_should():
    bad = ["trained at commit a70ad4f", "code 0123456789abcdef", "load average 3.7", "at a load of 8",
           "see issue 11", "issue #23"]
    for text in bad:
        assert any(rx.search(text) for rx, _ in FORBIDDEN), text
    for text in ["sha256", "bfloat16", "paper-60m", "deadbeef-free", "Table 12", "issue tracker"]:
        assert not any(rx.search(text) for rx, _ in FORBIDDEN), text


def _bash_commands(text: str) -> list[str]:
    """The `sinklab ...` command lines of the ```bash blocks (continuations joined, comments cut)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            words = shlex.split(line, comments=True)
            if "sinklab" in words and words[0] in ("sinklab", "torchrun"):
                out.append(words[words.index("sinklab"):])
    return out


def _resolve(words: list[str]):
    """(command, path, the arguments after it) for ``sinklab CMD [SUB] ARGS``."""
    from sinklab.cli.docs import subcommands

    cmd, path, rest = _root(), ["sinklab"], words[1:]
    while subcommands(cmd) and rest and rest[0] in subcommands(cmd):
        cmd, path, rest = subcommands(cmd)[rest[0]], [*path, rest[0]], rest[1:]
    return cmd, path, rest


EXAMPLES = [(p.name, " ".join(w)) for p in PAGES for w in _bash_commands(p.read_text(encoding="utf-8"))]


def test_there_are_examples_to_check():
    assert len(EXAMPLES) > 40 and {"README.md", "measure.md", "streaming.md"} <= {p for p, _ in EXAMPLES}


@pytest.mark.parametrize("page,line", EXAMPLES, ids=[f"{p}:{i}" for i, (p, _) in enumerate(EXAMPLES)])
def test_every_example_command_parses(page, line):
    """Parsed (types, choices, required arguments) by the command itself, nothing run."""
    cmd, path, rest = _resolve(shlex.split(line))
    assert len(path) > 1, f"{page}: no such command in {line!r}"
    from sinklab.cli.docs import subcommands

    assert not subcommands(cmd), f"{page}: {line!r} names a group, not a command"
    cmd.make_context(" ".join(path), list(rest))  # raises click's UsageError / BadParameter


def test_inline_commands_name_real_commands_and_options():
    """`sinklab CMD --opt ...` in running text: the command exists and takes every option named."""
    root = _root()
    for page in PAGES:
        for m in re.finditer(r"`(sinklab [a-z][^`]*)`", page.read_text(encoding="utf-8")):
            words = m.group(1).split()
            cmd, path, rest = _resolve(words)
            assert len(path) > 1 or words[1] in ("KIND",), (page.name, m.group(1))
            from sinklab.cli.docs import subcommands

            leaves = [cmd] if not subcommands(cmd) else list(subcommands(cmd).values())
            opts = {o for c in leaves for p in c.params for o in p.opts + p.secondary_opts} | {"--help"}
            for w in rest:
                flag = w.split("=", 1)[0]
                if flag.startswith("--") and "*" not in flag and len(flag) > 2:
                    assert flag in opts, (page.name, m.group(1), flag)
    assert root is not None


def test_pages_keep_what_other_issues_ask_for():
    """The KV-cache policies' Python use and a `sinklab stream --policy` command (streaming page); the GPU
    script and model.attention_backend (train and scaling pages)."""
    streaming = (DOCS / "streaming.md").read_text(encoding="utf-8")
    python = re.findall(r"```python\n(.*?)```", streaming, re.S)
    assert any("SinkCache(model, policy=" in b and "generate(" in b for b in python)
    assert any(w[:3] == ["sinklab", "stream", "perplexity"] and "--policy" in w for w in _bash_commands(streaming))
    text = {p: (DOCS / p).read_text(encoding="utf-8") for p in ("train.md", "scaling.md")}
    assert "bash benchmarks/gpu.sh" in text["scaling.md"]
    assert "`model.attention_backend`" in text["train.md"] and "attention_backend=flex" in text["train.md"]


def _resolves(name: str) -> bool:
    """Whether the dotted ``sinklab...`` name is a module, or an attribute reached from the longest importable
    module prefix."""
    import importlib

    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        try:
            for p in parts[i:]:
                obj = getattr(obj, p)
        except AttributeError:
            return False
        return True
    return False


def test_every_python_name_in_the_docs_exists():
    """Every ``sinklab.x.y`` the README and docs name is importable (an outside audit found
    ``sinklab.train.load_config`` in train.md's example, gone from ``sinklab.train`` since 59ac76e)."""
    dotted = re.compile(r"(?<![\w/.-])sinklab(?:\.[A-Za-z_]\w*)+")
    missing = set()
    for page in PAGES:
        names = [m for m in dotted.findall(page.read_text(encoding="utf-8")) if not re.search(r"\.[A-Z]$", m)]
        missing |= {f"{page.name}: {m}" for m in names if not _resolves(m)}  # (".X": a placeholder)
    assert not missing, sorted(missing)
