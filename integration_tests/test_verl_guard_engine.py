"""The guarded loss in verl's own CPU engine (FSDP2, gloo): a poisoned micro-batch is skipped.

``verl_guard_worker.py`` runs one optimizer step per case from the same initial weights and optimizer state (one
mini-batch of 4 sequences, micro-batches of 1) and reports weights and the gradients ``optimizer.step()``
received. The guarded step with a poisoned sequence must equal the step without that micro-batch at the same
normaliser (bit-identical on one process; compared at 1e-6); verl's own ``gspo`` loss on the same data gives
a NaN gradient norm, and verl's engine then throws away the whole update, clean micro-batches included.

About 65 s on 2 shared cores (mostly verl's import and the engine's build).
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("verl") is None:  # not importorskip: importing verl here would cost ~25 s
    pytest.skip("needs verl (pip install 'rlguard[verl]')", allow_module_level=True)

WORKER = Path(__file__).with_name("verl_guard_worker.py")
TIMEOUT_S = 420
TOL = 1e-6


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("verl_guard") / "out.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", str(WORKER), str(out)]
    try:
        done = subprocess.run(cmd, cwd=out.parent, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the verl guard worker did not finish in {TIMEOUT_S} s: {str(err.output)[-4000:]}")
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    loaded: dict[str, Any] = json.loads(out.read_text())
    return loaded


@pytest.mark.slow
def test_verl_guarded_loss_skips_poisoned_micro_batch(result: dict[str, Any]) -> None:
    cases, diffs, grads = result["cases"], result["diffs"], result["grad_diffs"]
    for name in ("poisoned_guarded", "poisoned_old_guarded"):
        case = cases[name]
        assert case["finite"] and case["optimizer_steps"] == 1, name
        assert all(math.isfinite(v) for v in case["grad_norm"] + case["loss"]), name
        # the poisoned micro-batch added zero gradient: the step is the step without it
        assert grads[f"{name}-without"] <= TOL, name
        assert diffs[f"{name}-without"] <= TOL, name
        assert case["grad_norm"] == pytest.approx(cases["without"]["grad_norm"], rel=TOL)
        assert case["loss"] == pytest.approx(cases["without"]["loss"], rel=TOL)
        # reported: one micro-batch of four skipped, its non-finite values counted
        assert case["rlguard/guard/skipped"] == [0.25], name
        assert case["rlguard/guard/poisoned_seqs"] == [0.25], name
        assert case["rlguard/nonfinite"][0] > 0, name
    # the comparison can fail: with the clean sequence 2 the gradient is another one
    assert grads["without-clean_plain"] > 1e-3
    assert result["grad_max"]["without"] > 1e-3


@pytest.mark.slow
def test_verl_unguarded_poison_loses_the_whole_update(result: dict[str, Any]) -> None:
    native = result["cases"]["poisoned_verl_gspo"]
    # verl's own gspo: NaN loss and gradient norm; verl's engine refuses the step, so the clean micro-batches'
    # update is lost too (the weights stay the initial ones) -- the weights do not become NaN in verl 0.9.1
    assert math.isnan(native["loss"][0]) and math.isnan(native["grad_norm"][0])
    assert native["optimizer_steps"] == 0 and native["finite"]
    assert result["diffs"]["poisoned_verl_gspo-initial"] == 0.0
    assert result["diffs"]["without-initial"] > 1e-3
    # rlguard.gspo unguarded (on_nonfinite="raise") stops with the tensor named
    assert "advantages contains 3 NaN values" in result["cases"]["poisoned_raise"]["error"]


@pytest.mark.slow
def test_verl_guard_is_transparent_on_clean_data_and_sets_the_clip_range(result: dict[str, Any]) -> None:
    diffs, grads = result["diffs"], result["grad_diffs"]
    assert grads["clean_guarded-clean_plain"] <= TOL and diffs["clean_guarded-clean_plain"] <= TOL
    # clip_scale=0.5 sent through verl's set_loss_fn == verl's clip_ratio_low/high halved
    assert grads["clip_guarded-clip_plain"] <= TOL and diffs["clip_guarded-clip_plain"] <= TOL
    assert grads["clip_plain-clean_plain"] > 1e-3  # the narrower clip range changes the step
    assert result["cases"]["clip_guarded"]["rlguard/guard/clip_scale"] == [0.5]
    print(f"engine built in {result['build_s']:.1f} s, {len(result['cases'])} updates in {result['updates_s']:.1f} s")
