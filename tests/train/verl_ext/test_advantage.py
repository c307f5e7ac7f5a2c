"""The registered role-wise estimator against verl's own GRPO (one-row groups included)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from envace.train.verl_ext.advantage import ESTIMATOR, compute_role_wise_advantage, role_group_ids


def _batch(rewards: list[float], t: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.ones(len(rewards), t)
    scores = torch.zeros(len(rewards), t)
    scores[:, -1] = torch.tensor(rewards)
    return scores, mask


def test_one_row_group_matches_verl_grpo() -> None:
    # uid u: ACT rows R = 1, 0 (mean 0.5); one REHEARSE row R = 0.7 -> A = 0.7 (verl: mean 0, std 1).
    ids = role_group_ids(["u", "u", "u"], ["act", "act", "rehearse"])
    scores, mask = _batch([1.0, 0.0, 0.7])
    cfg = OmegaConf.create({"norm_adv_by_std_in_grpo": False})
    adv, _ = compute_role_wise_advantage(scores, mask, index=ids, config=cfg)
    np.testing.assert_allclose(adv[:, 0].numpy(), [0.5, -0.5, 0.7], atol=1e-6)
    ref, _ = compute_grpo_outcome_advantage(scores, mask, ids, norm_adv_by_std_in_grpo=False)
    np.testing.assert_allclose(adv.numpy(), ref.numpy(), atol=1e-6)


@pytest.mark.parametrize(("setting", "expected"), [("reward", 0.7), ("zero", 0.0)])
def test_singleton_switch(setting: str, expected: float) -> None:
    ids = role_group_ids(["u"], ["rehearse"])
    scores, mask = _batch([0.7])
    cfg = OmegaConf.create({"norm_adv_by_std_in_grpo": False, "envace_singleton_advantage": setting})
    adv, _ = compute_role_wise_advantage(scores, mask, index=ids, config=cfg)
    np.testing.assert_allclose(adv.numpy(), np.full((1, 3), expected), atol=1e-6)


def test_advantage_sign_negative_control() -> None:
    """``envace_advantage_sign: -1`` (the learning test's negative control) negates every advantage,
    as verl's registry hands the estimator to the trainer; any other value is refused."""
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    fn = get_adv_estimator_fn(ESTIMATOR)
    ids = role_group_ids(["u", "u", "v"], ["act", "act", "act"])
    scores, mask = _batch([1.0, 0.0, 0.7])
    base, _ = fn(scores, mask, index=ids, config=OmegaConf.create({"envace_advantage_sign": 1}))
    flipped, _ = fn(scores, mask, index=ids, config=OmegaConf.create({"envace_advantage_sign": -1}))
    np.testing.assert_allclose(flipped.numpy(), -base.numpy(), atol=1e-6)
    assert float(base[0, 0]) > 0 > float(flipped[0, 0])
    with pytest.raises(ValueError, match="envace_advantage_sign"):
        fn(scores, mask, index=ids, config=OmegaConf.create({"envace_advantage_sign": 0}))


def test_rehearse_advantage_zero_control() -> None:
    """``envace_rehearse_advantage: zero`` (the REHEARSE-side control) sets every REHEARSE row's advantage
    to 0 and leaves the ACT rows' as they are; any other value is refused."""
    ids = role_group_ids(["u", "u", "u", "u", "v"], ["act", "act", "rehearse", "rehearse", "rehearse"])
    scores, mask = _batch([1.0, 0.0, 1.0, 0.0, 0.7])
    base, _ = compute_role_wise_advantage(scores, mask, index=ids, config=OmegaConf.create({}))
    ctrl, _ = compute_role_wise_advantage(scores, mask, index=ids,
                                          config=OmegaConf.create({"envace_rehearse_advantage": "zero"}))
    np.testing.assert_allclose(base[:, 0].numpy(), [0.5, -0.5, 0.5, -0.5, 0.7], atol=1e-6)
    np.testing.assert_allclose(ctrl[:, 0].numpy(), [0.5, -0.5, 0.0, 0.0, 0.0], atol=1e-6)
    with pytest.raises(ValueError, match="envace_rehearse_advantage"):
        compute_role_wise_advantage(scores, mask, index=ids,
                                    config=OmegaConf.create({"envace_rehearse_advantage": "off"}))
