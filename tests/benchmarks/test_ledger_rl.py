"""``benchmarks/ledger_rl.py`` without verl: the config it derives (and ``envace`` validates), and its
held-out measurement and paired gains on two ledger tasks with the untrained tiny model. The whole run,
training included, is the learning test's (tests/learning, ``-m learning``)."""

from __future__ import annotations

import math

from envace.common.config import load_config


def test_derived_config_trains_the_ledger_with_the_run_overrides(script, tmp_path) -> None:
    rl = script("ledger_rl")
    args = rl.parser().parse_args([
        "--base", "/models/warm", "--out", str(tmp_path), "--steps", "6", "--lr", "2e-3", "--prompts", "3",
        "--rollouts", "5", "--seed", "7", "--sign", "-1", "--max-tokens", "32", "--n-train", "16",
        "--n-test", "8", "--show-balances"])
    cfg = load_config(rl.write_config(args, tmp_path))
    assert all(path.startswith(str(tmp_path)) for path in cfg["paths"].values())
    assert cfg["benchmarks"]["ledger"]["ledger"] == {"seed": 0, "n_train": 16, "n_test": 8,
                                                     "show_balances": True}
    assert cfg["training"]["data"]["source"] == str(tmp_path / "ledger_train.jsonl")
    assert cfg["training"]["reward"] == "reference_grounded"
    run = cfg["training"]["runs"][rl.RUN]
    assert {k: run[k] for k in ("base_model", "lr", "total_steps", "save_every", "prompts_per_step",
                                "rollouts_per_prompt", "seed", "max_response_tokens")} == {
        "base_model": "/models/warm", "lr": 2e-3, "total_steps": 6, "save_every": 6, "prompts_per_step": 3,
        "rollouts_per_prompt": 5, "seed": 7, "max_response_tokens": 32}
    assert run["episode"]["advantage_sign"] == -1 and run["episode"]["rehearse_max_tokens"] == 32


def test_a_run_shorter_than_the_smoke_checkpoints_is_a_valid_config(script, tmp_path) -> None:
    """Fewer steps than smoke.yaml's Figure 5 checkpoints (2, 4): the derived config still validates; 0
    steps is refused by the command line."""
    import pytest

    rl = script("ledger_rl")
    args = rl.parser().parse_args(["--base", "/m", "--out", str(tmp_path), "--steps", "1"])
    cfg = load_config(rl.write_config(args, tmp_path))
    assert cfg["evaluation"]["checkpoints"]["steps"] == [1]
    assert cfg["training"]["runs"][rl.RUN]["total_steps"] == 1
    with pytest.raises(SystemExit):
        rl.parser().parse_args(["--base", "/m", "--out", str(tmp_path), "--steps", "0"])


def test_held_out_scores_and_their_paired_gains(script, tiny_model_dir) -> None:
    rl = script("ledger_rl")
    args = rl.parser().parse_args(["--base", str(tiny_model_dir), "--out", "unused", "--n-test", "2",
                                   "--samples", "1"])
    scores = rl.held_out(str(tiny_model_dir), args)
    fidelity = ["agree", "exact", "field_f1"]
    assert list(scores) == ["success", *fidelity, *(f"ref_{m}" for m in fidelity)]
    for metric, per_task in scores.items():
        assert len(per_task) == 2, metric
        assert all(0 <= x <= 1 for values in per_task.values() for x in values), metric
    gains = rl.gains({"base": scores, "trained": scores})
    assert list(gains) == list(scores)
    for metric, gain in gains.items():
        assert all(math.isfinite(v) for v in gain.values()), metric
        assert gain["base"] == gain["trained"] and gain["diff"] == 0 and gain["low"] <= 0 <= gain["high"]
