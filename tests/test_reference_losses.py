"""The pinned reference training runs (issue 20): a refactor of the training path must leave their
per-step losses unchanged.

Two 24-step runs (``tests/reference_losses.py``: a causal LM, and a prefix LM with a sliding window;
2 layers, d 32, T 32, 2 micro-batches a step, AdamW with cosine schedule, clipping and weight decay,
1 thread, fp32; about 2 s) are trained with the current code and
compared with ``tests/data/reference_losses.json``, which records their losses together with the CPU
model, the torch version and the thread count they were computed with.

* On the recorded machine key (same CPU model, torch version and threads) every step's loss must be
  **bit-equal**: a CPU training is deterministic there, so any difference is a change of numerics.
* On another key the losses are compared with a relative tolerance of :data:`RTOL` = 1e-5 on every
  step. Rounding differences of other kernels (another CPU's SIMD width, another torch build) were
  measured by simulation on the recorded machine: a relative perturbation of 1.2e-7 of every initial
  weight, or of 1e-6 of every gradient element at every step, moves these losses by at most
  1.5e-7 relative over the 24 steps (these short runs do not amplify noise). Real changes are far
  above the tolerance: the learning rate 0.1 % higher moves them by 1.3e-4, ``norm_eps`` 1e-5 ->
  1.1e-5 by 7e-5 (a 1 % change of weight decay, 5e-6, is the size below which a change can pass
  unseen off the recorded machine; on it, nothing passes).

Regenerate the file with ``PYTHONPATH=src python tests/reference_losses.py --update`` (only for an
intended change of numerics, said in the commit message).
"""

import json
import math

import pytest

import reference_losses as ref

#: relative tolerance per step off the recorded machine key (see the module docstring)
RTOL = 1e-5


@pytest.fixture(scope="module")
def recorded():
    return json.loads(ref.REFERENCE_FILE.read_text())


@pytest.mark.parametrize("name", sorted(ref.RUNS))
def test_reference_run_losses_are_pinned(name, recorded):
    got = ref.train_reference(name)
    want = recorded["runs"][name]
    assert len(got["losses"]) == len(want["losses"]) == 24
    if ref.key() == recorded["key"]:
        bad = [s + 1 for s, (a, b) in enumerate(zip(want["losses"], got["losses"])) if a != b]
        assert not bad, (f"{name}: the losses of steps {bad} differ from {ref.REFERENCE_FILE.name} on its own machine key "
                         f"{recorded['key']}: the training numerics changed (first: {want['losses'][bad[0] - 1]!r} -> "
                         f"{got['losses'][bad[0] - 1]!r})")
        assert got["val_loss"] == want["val_loss"]
    else:
        for s, (a, b) in enumerate(zip(want["losses"], got["losses"]), start=1):
            assert math.isclose(a, b, rel_tol=RTOL), f"{name}: step {s}: loss {b!r}, recorded {a!r} (rtol {RTOL:g})"
        for s, v in want["val_loss"].items():
            assert math.isclose(got["val_loss"][s], v, rel_tol=RTOL, abs_tol=1e-6), f"{name}: val_loss at step {s}"


def test_reference_file_records_its_machine_key(recorded):
    assert set(recorded["key"]) == {"cpu_model", "torch_version", "threads"}
    assert recorded["key"]["threads"] == 1 and recorded["key"]["torch_version"] and recorded["key"]["cpu_model"]
    assert set(recorded["runs"]) == set(ref.RUNS)


def test_a_changed_learning_rate_is_caught_even_off_the_recorded_machine(recorded, monkeypatch):
    """The tolerance is not too loose: lr 0.1 % higher moves some step's loss by more than RTOL."""
    monkeypatch.setitem(ref.RUNS, "causal", ref.RUNS["causal"].replace("lr = 1e-2", "lr = 1.001e-2"))
    got = ref.train_reference("causal")["losses"]
    want = recorded["runs"]["causal"]["losses"]
    assert max(abs(a - b) / abs(a) for a, b in zip(want, got)) > 5 * RTOL
