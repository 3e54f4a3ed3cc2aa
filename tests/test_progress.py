"""sinklab.progress (issue 21, item 6): without a terminal, a plain line every 10% or 30 s, whichever comes
first, and at the end; never a carriage return; a terminal gets the tqdm bar."""

from __future__ import annotations

import io

import pytest

from sinklab.progress import PlainProgress, progress


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_line_every_tenth_of_the_total():
    out, clock = io.StringIO(), Clock()
    bar = PlainProgress(total=100, desc="train", unit="step", stream=out, clock=clock)
    for _ in range(100):
        clock.t += 0.1
        bar.update(1)
    bar.close()
    lines = out.getvalue().splitlines()
    assert [ln.split()[2] for ln in lines] == [f"{k}/100" for k in range(10, 101, 10)]
    assert lines[0] == "train: step 10/100 (10%), 1.0 s elapsed, about 9.0 s left"
    assert lines[-1] == "train: step 100/100 (100%), 10.0 s elapsed"
    assert "\r" not in out.getvalue()


def test_a_line_every_30_s_when_a_tenth_takes_longer_with_the_postfix_and_a_resumed_start():
    out, clock = io.StringIO(), Clock()
    bar = PlainProgress(total=1000, desc="train", unit="step", initial=400, stream=out, clock=clock)
    for _ in range(3):
        clock.t += 20.0  # one step every 20 s: 10% (100 steps) would take half an hour
        bar.set_postfix({"loss": "2.500"}, refresh=False)
        bar.update(1)
    lines = out.getvalue().splitlines()
    # the first line after 40 s (>= 30 s since the start), the next 30 s after it would be due at 70 s
    assert lines == ["train: step 402/1000 (40%), 40.0 s elapsed, about 3 h 19 min left; loss 2.500"]
    bar.close()  # the end: where it stopped
    assert out.getvalue().splitlines()[-1] == "train: step 403/1000 (40%), 1 min 00 s elapsed, about 3 h 19 min left; loss 2.500"


def test_iteration_unknown_total_and_disabled():
    out, clock = io.StringIO(), Clock()
    seen = []
    for x in PlainProgress(range(3), desc="probe", unit="batch", stream=out, clock=clock):
        seen.append(x)
    assert seen == [0, 1, 2] and out.getvalue().splitlines()[-1] == "probe: batch 3/3 (100%), 0.0 s elapsed"
    out2 = io.StringIO()
    bar = PlainProgress(desc="tokens", unit="chunk", stream=out2, clock=clock)
    bar.update(5)
    clock.t = 31.0
    bar.update(1)
    assert out2.getvalue() == "tokens: chunk 6, 31.0 s elapsed\n"
    out3 = io.StringIO()
    assert list(progress(range(4), enabled=False, stream=out3)) == [0, 1, 2, 3] and out3.getvalue() == ""


def test_a_terminal_gets_the_tqdm_bar():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    from tqdm import tqdm

    bar = progress(total=3, desc="train", stream=Tty())
    assert isinstance(bar, tqdm)
    bar.close()
    assert isinstance(progress(total=3, desc="train", stream=io.StringIO()), PlainProgress)


@pytest.mark.integration
def test_stream_and_measure_in_a_log_file_get_plain_lines(tiny_model_dir, text_corpus_dir, tmp_path, capsys):
    """`sinklab stream ... 2> log` used to write tqdm's carriage-return frames and cursor codes there."""
    from sinklab.cli.main import app

    for argv in (["stream", "perplexity", "--model", str(tiny_model_dir), "--corpus", str(text_corpus_dir), "--tokens", "40",
                  "--window", "8", "--sinks", "0,1", "--mode", "decode", "--out", str(tmp_path / "s")],
                 ["measure", "--model", str(tiny_model_dir), "--corpus", str(text_corpus_dir), "-n", "4", "-t", "8",
                  "--batch-size", "1", "--out", str(tmp_path / "m")]):
        try:
            app(argv)
        except SystemExit as e:
            assert e.code in (0, None)
        err = capsys.readouterr().err
        assert "\r" not in err and "\x1b" not in err
        if argv[0] == "stream":
            assert "caches: configuration 4/4 (100%), " in err and "sinks_1: token 39/39 (100%), " in err, err
        else:
            assert [ln.split(",")[0] for ln in err.splitlines()] == [f"probe: batch {k}/4 ({25 * k}%)" for k in (1, 2, 3, 4)]
