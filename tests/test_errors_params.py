"""Library errors name the parameter; the CLI names its option (issue 38 part 2): one mechanism,
:func:`sinklab.errors.param` marks in the message, written out by ``str(error)`` (Python) and by
:func:`sinklab.cli.common.cli_text` (the CLI)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

from sinklab.cli.common import cli_text, option_of
from sinklab.errors import InputError, UnknownNameError, param, render

SRC = Path(__file__).resolve().parent.parent / "src" / "sinklab"


def test_param_written_out_for_python_and_for_the_cli():
    text = (f"{param('eps')} must lie in (0, 1); {param('seq_len', 512)} is long; pass "
            f"{param('allow_long_context', True)}; not {param('progress', False)}; {param('input', 'run')}; "
            f"{param('data.max_epochs', 3)}; {param('policies')}")
    assert render(text) == ("eps must lie in (0, 1); seq_len=512 is long; pass allow_long_context=True; not "
                            "progress=False; input='run'; data.max_epochs=3; policies")
    assert cli_text(text) == ("--eps must lie in (0, 1); --seq-len 512 is long; pass --allow-long-context; not "
                              "--no-progress; --input run; --set data.max_epochs=3; --policy")
    assert option_of("num_samples") == "--num-samples" and option_of("time_min") == "--time"


def test_error_str_and_repr_show_python_names_the_marks_stay_for_the_cli():
    e = InputError(f"{param('num_samples')} must be >= 1, got 0")
    assert str(e) == "num_samples must be >= 1, got 0" and repr(e) == "InputError('num_samples must be >= 1, got 0')"
    assert cli_text(e.marked) == "--num-samples must be >= 1, got 0"
    k = UnknownNameError(f"unknown {param('policies')} 'x'")
    assert str(k) == "unknown policies 'x'"  # not KeyError's quoting
    with pytest.raises(InputError, match="^num_samples must be >= 1, got 0$"):
        raise e


def test_measure_eps_names_the_parameter_not_the_flag():
    import sinklab

    with pytest.raises(InputError) as e:
        sinklab.measure(eps=2)
    assert str(e.value) == "eps must lie in (0, 1), got 2" and "--" not in str(e.value)


def test_an_unknown_probe_input_names_the_parameter(capsys):
    """measure(input='bogus') said "unknown probe input 'bogus'" without the parameter (outside audit); now
    input (Python) and --input (CLI)."""
    import sinklab
    from helpers import run_cli_captured
    from sinklab.errors import UnknownNameError

    with pytest.raises(UnknownNameError, match=r"^input: unknown probe input 'bogus'; valid names: natural, random, "):
        sinklab.measure(input="bogus")
    code, _, err = run_cli_captured(["measure", "--input", "bogus"], capsys)
    assert code == 2 and err.startswith("error: --input: unknown probe input 'bogus'")


def test_python_errors_name_python_parameters():
    """A typo in a keyword raised TypeError from the config's __init__; the long-context refusal said
    'pass --allow-long-context' to a Python caller (the message scan missed strings nested in parentheses)."""
    import sinklab

    with pytest.raises(InputError, match=r"^measure\(\) got an unknown option 'num_sample' \(did you mean 'num_samples'\?\)"):
        sinklab.measure(num_sample=2)
    text = f"{param('seq_len', 9000)} is past m's context; pass {param('allow_long_context', True)} to try anyway"
    assert render(text) == "seq_len=9000 is past m's context; pass allow_long_context=True to try anyway"
    assert cli_text(text) == "--seq-len 9000 is past m's context; pass --allow-long-context to try anyway"


def test_cli_names_the_flag(capsys):
    from helpers import run_cli_captured

    code, _, err = run_cli_captured(["measure", "--eps", "2"], capsys)
    assert code == 2 and err.strip() == "error: --eps must lie in (0, 1), got 2.0"
    code, _, err = run_cli_captured(["measure", "--num-samples", "0"], capsys)
    assert code == 2 and err.strip() == "error: --num-samples must be >= 1, got 0"


_FLAG = re.compile(r"(?<![\w`-])--[a-z][a-z0-9-]*")


def _messages_with_flags(path: Path, root: Path = SRC) -> list[str]:
    """String literals inside calls of ``...Error(...)``, ``Wording(...)``, ``check_writable(...)`` that
    hold a ``--flag`` outside a quoted command (`` `sinklab ... --out` ``)."""
    out, stack, prev = [], [], None
    for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if t.type == tokenize.OP and t.string in "([{":
            stack.append(prev.string if t.string == "(" and prev is not None and prev.type == tokenize.NAME else "")
        elif t.type == tokenize.OP and t.string in ")]}":
            stack and stack.pop()
        elif t.type == tokenize.STRING and any(re.search(r"(Error|Wording|check_writable|_warn)$", c) for c in stack):
            unquoted = re.sub(r"`[^`]*`", "", t.string)
            if _FLAG.search(unquoted):
                out.append(f"{path.relative_to(root)}:{t.start[0]}: {t.string}")
        if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
            prev = t
    return out


def test_no_library_message_writes_a_flag():
    found = [m for p in sorted(SRC.rglob("*.py")) if "cli" not in p.relative_to(SRC).parts
             for m in _messages_with_flags(p)]
    assert found == [], "library messages name parameters with sinklab.errors.param, not --flags:\n" + "\n".join(found)


def test_the_scan_finds_a_flag(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('raise InputError(f"--eps must lie in (0, 1)")\nraise InputError("run `sinklab x --out D`")\n'
                 'raise InputError(f"{param(\'eps\')} must lie in (0, 1)")\n')
    assert [m.split(": ", 1)[1] for m in _messages_with_flags(f, tmp_path)] == ['f"--eps must lie in (0, 1)"']
