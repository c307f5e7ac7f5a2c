"""Tests for envace.core.advantage.role_wise_grpo."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envace.core.advantage import role_wise_grpo


def test_hand_computed_weighted_by_row_count() -> None:
    # uid "a": rollout 1 (R=1) has 2 ACT rows + 2 REHEARSE rows, rollout 2 (R=0) has 1 ACT + 1 REHEARSE.
    uids = ["a"] * 6
    roles = ["act", "act", "rehearse", "rehearse", "act", "rehearse"]
    rewards = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    adv = role_wise_grpo(uids, roles, rewards)
    mu = 2.0 / 3.0  # row-weighted mean, not the rollout mean 0.5
    np.testing.assert_allclose(adv, [1 - mu, 1 - mu, 1 - mu, 1 - mu, -mu, -mu])


def test_hand_computed_two_groups_and_missing_role() -> None:
    uids = ["a", "a", "a", "b", "b", "b"]
    roles = ["act", "act", "rehearse", "act", "act", "act"]
    rewards = [0.2, 0.6, 0.9, 1.0, 0.0, 0.5]
    adv = role_wise_grpo(uids, roles, rewards)
    # ("a","rehearse") has a single row -> A = R = 0.9 (verl GRPO: mean 0, std 1); "b" has no rehearse rows.
    np.testing.assert_allclose(adv, [-0.2, 0.2, 0.9, 0.5, -0.5, 0.0])
    old = role_wise_grpo(uids, roles, rewards, singleton="zero")  # ours before: the singleton gets 0
    np.testing.assert_allclose(old, [-0.2, 0.2, 0.0, 0.5, -0.5, 0.0])


def test_one_row_group_gets_its_reward() -> None:
    # Hand-computed: ("u","rehearse") holds one row with R=0.7 -> A = 0.7 - 0 = 0.7; the ACT pair 1.0/0.0
    # has mean 0.5 -> +-0.5. verl.trainer.ppo.core_algos.compute_grpo_outcome_advantage gives the same.
    adv = role_wise_grpo(["u", "u", "u"], ["act", "act", "rehearse"], [1.0, 0.0, 0.7])
    np.testing.assert_allclose(adv, [0.5, -0.5, 0.7])
    np.testing.assert_allclose(role_wise_grpo(["u"], ["act"], [-0.1]), [-0.1])
    with pytest.raises(ValueError, match="singleton"):
        role_wise_grpo(["u"], ["act"], [1.0], singleton="mean")


def test_norm_by_std() -> None:
    adv = role_wise_grpo([0, 0, 0, 0], ["act"] * 4, [1.0, 0.0, 1.0, 0.0], norm_by_std=True, eps=0.0)
    np.testing.assert_allclose(adv, [1.0, -1.0, 1.0, -1.0])
    single = role_wise_grpo([0], ["act"], [3.0], norm_by_std=True)
    np.testing.assert_allclose(single, [3.0 / (1 + 1e-6)])  # verl: (R - 0) / (1 + eps)
    np.testing.assert_allclose(role_wise_grpo([0], ["act"], [3.0], norm_by_std=True, singleton="zero"), [0.0])
    constant = role_wise_grpo([0, 0], ["act", "act"], [0.5, 0.5], norm_by_std=True)
    np.testing.assert_allclose(constant, [0.0, 0.0])


def test_accepts_numpy_and_empty() -> None:
    adv = role_wise_grpo(np.array([1, 1]), np.array(["act", "act"]), np.array([1.0, 3.0]))
    np.testing.assert_allclose(adv, [-1.0, 1.0])
    assert role_wise_grpo([], [], []).shape == (0,)


@pytest.mark.parametrize(
    ("uids", "roles", "rewards", "match"),
    [
        (["a"], ["act", "act"], [1.0, 1.0], "same length"),
        (["a", "a"], ["act", "act"], [1.0], "same length"),
        (["a", "a"], ["act", "act"], [1.0, float("nan")], "finite"),
        (["a"], ["act"], [[1.0]], "one-dimensional"),
    ],
)
def test_rejects_bad_input(uids, roles, rewards, match) -> None:
    with pytest.raises(ValueError, match=match):
        role_wise_grpo(uids, roles, rewards)


def _std_grpo(uids: list[int], rewards: list[float]) -> np.ndarray:
    """Reference standard GRPO (loop version of verl's, no std) for the property tests: a one-score
    group has mean 0."""
    out = np.zeros(len(rewards))
    for u in set(uids):
        idx = [i for i, x in enumerate(uids) if x == u]
        mean = np.mean([rewards[i] for i in idx]) if len(idx) > 1 else 0.0
        for i in idx:
            out[i] = rewards[i] - mean
    return out


reward_st = st.floats(-10, 10, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), reward_st), min_size=1, max_size=20))
def test_one_output_per_role_equals_per_role_grpo(rollouts: list[tuple[int, float]]) -> None:
    uids, roles, rewards = [], [], []
    for uid, r in rollouts:
        for role in ("act", "rehearse"):
            uids.append(uid)
            roles.append(role)
            rewards.append(r)
    adv = role_wise_grpo(uids, roles, rewards)
    for role in ("act", "rehearse"):
        idx = [i for i, x in enumerate(roles) if x == role]
        expected = _std_grpo([uids[i] for i in idx], [rewards[i] for i in idx])
        np.testing.assert_allclose(adv[idx], expected, atol=1e-9)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["act", "rehearse"]), reward_st), min_size=1,
             max_size=30),
    st.randoms(use_true_random=False),
    st.booleans(),
)
def test_row_order_invariance(rows, rnd, norm) -> None:
    uids, roles, rewards = map(list, zip(*rows, strict=True))
    perm = list(range(len(rows)))
    rnd.shuffle(perm)
    adv = role_wise_grpo(uids, roles, rewards, norm_by_std=norm)
    adv_p = role_wise_grpo([uids[i] for i in perm], [roles[i] for i in perm], [rewards[i] for i in perm],
                           norm_by_std=norm)
    np.testing.assert_allclose(adv_p, adv[perm], atol=1e-9)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), reward_st), min_size=1, max_size=30))
def test_single_role_is_standard_grpo(rows) -> None:
    uids, rewards = map(list, zip(*rows, strict=True))
    adv = role_wise_grpo(uids, ["any"] * len(uids), rewards)
    np.testing.assert_allclose(adv, _std_grpo(uids, rewards), atol=1e-9)
