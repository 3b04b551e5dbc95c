"""Examples of the docs site that a user copies, run as written: the plain-torch loop of docs/guides/torch.md (its
free names bound to a tiny model and batches) and the TRL guide's table of the ways to write GSPO (each row's
settings mapped by ``GuardedGRPOConfig``, against what the row says it trains). The plugin guide's files are
tested as written in tests/project/test_plugin_example.py."""

from __future__ import annotations

import ast
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from rlguard.core_losses import PolicyBatch
from tests.helpers.docs_pages import code_blocks
from tests.helpers.docs_pages import section as _section


def _python_block(section: str) -> str:
    """The first Python code block of ``section``."""
    blocks = code_blocks(section, "python")
    assert blocks, section
    return blocks[0]


def test_the_plain_torch_loop_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = _python_block(_section("guides/torch.md", "## The guard in the loop"))
    assert "guard.apply(decision, actuator)" in code
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 8)  # features -> logits over 8 tokens
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, tokens = torch.randn(8, 5, 4), torch.randint(0, 8, (8, 5))  # (B, T, H), (B, T)
    rewards, group_ids = torch.rand(8), torch.arange(8) // 4  # (B,): two groups of 4
    lengths = torch.full((8,), 5.0)

    def loader() -> Iterator[PolicyBatch]:
        for _ in range(6):  # each batch from the current weights, as a rollout would be
            logprobs = torch.log_softmax(model(x), dim=-1).gather(-1, tokens[..., None]).squeeze(-1)  # (B, T)
            adv = (rewards - rewards.view(2, 4).mean(1).repeat_interleave(4)).float()  # (B,)
            yield PolicyBatch(logprobs=logprobs, advantages=adv, mask=torch.ones(8, 5), old_logprobs=logprobs.detach())

    before = model.weight.detach().clone()
    namespace: dict[str, Any] = {
        "model": model, "optimizer": optimizer, "loader": loader(), "lr": 1e-2,
        "rewards": rewards, "group_ids": group_ids, "lengths": lengths,
    }  # fmt: skip
    monkeypatch.chdir(tmp_path)
    os.makedirs("out")
    exec(compile(code, "docs/guides/torch.md", "exec"), namespace)
    guard, applied = namespace["guard"], namespace["applied"]
    assert namespace["step"] == 5 and applied.outcome == "step"
    assert guard.last_healthy_step == 5
    assert not torch.equal(model.weight, before)  # the actuator ran optimizer.step()


def _gspo_rows() -> list[tuple[str, str]]:
    section = _section("guides/trl.md", "### GSPO, and TRL's own ways to write it")
    rows = re.findall(r"^\| ((?:`[^`]+`(?:, )?)+) \| (.+) \|$", section, re.MULTILINE)
    assert len(rows) == 4, section
    return [(", ".join(re.findall(r"`([^`]+)`", cell)), trains) for cell, trains in rows]


def _settings(cell: str) -> dict[str, Any]:
    call = ast.parse(f"f({cell})", mode="eval").body
    assert isinstance(call, ast.Call)
    return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if kw.arg}


@pytest.mark.parametrize(("cell", "trains"), _gspo_rows())
def test_each_spelling_of_gspo_in_the_trl_guide_trains_what_it_says(cell: str, trains: str) -> None:
    pytest.importorskip("trl")
    from rlguard.adapters.trl import GuardedGRPOConfig

    def mapping(**settings: Any) -> tuple[str, dict[str, Any]]:
        args = GuardedGRPOConfig(output_dir="out", use_cpu=True, report_to="none", **settings)
        return args.rlguard_mapping.objective, args.rlguard_mapping.kwargs

    paper = mapping(objective="gspo")
    assert (paper[0], paper[1]["clip_low"], paper[1]["clip_high"]) == ("gspo", 3e-4, 4e-4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        objective, kwargs = mapping(**_settings(cell))
    # the length-weighting warning, where the row says so
    assert any("sums over tokens" in str(w.message) for w in caught) == ("warned" in trains)
    if trains.startswith(("the paper's GSPO", "the same")):
        assert (objective, kwargs) == paper
    else:
        assert "TRL's defaults" in trains and "0.2 / 0.2" in trains and "`token-mean`" in trains
        assert (objective, kwargs["clip_low"], kwargs["clip_high"]) == ("gspo", 0.2, 0.2)
        assert kwargs["aggregation"] == "token-mean"
