"""envace.common.stats: point estimates, interval properties and coverage by simulation."""

from __future__ import annotations

import numpy as np
import pytest

from envace.common.stats import (
    TaskMatrix,
    bootstrap_linear,
    bootstrap_mean,
    bootstrap_paired_diff,
    bootstrap_stratified_mean,
)


def one_group(values: np.ndarray) -> TaskMatrix:
    values = np.asarray(values, dtype=float)
    return TaskMatrix(values, np.zeros(len(values), dtype=int), np.ones(1))


def test_point_is_weighted_group_mean_of_run_means() -> None:
    values = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.5, 0.5], [1.0, 0.0]])
    m = TaskMatrix(values, np.array([0, 0, 1, 1, 1]), np.array([10.0, 30.0]))
    group0 = (0.5 + 1.0) / 2
    group1 = (0.0 + 0.5 + 0.5) / 3
    assert m.point() == pytest.approx(0.25 * group0 + 0.75 * group1)
    assert m.group_means() == pytest.approx([group0, group1])


def test_interval_is_seeded_and_contains_point_within_score_range() -> None:
    rng = np.random.default_rng(3)
    m = one_group((rng.random((40, 3)) < 0.3).astype(float))
    a = bootstrap_mean(m, resamples=2000, seed=7)
    b = bootstrap_mean(m, resamples=2000, seed=7)
    assert a == b
    assert 0.0 <= a.low <= a.point <= a.high <= 1.0
    assert not a.degenerate


def test_degenerate_when_all_values_equal() -> None:
    iv = bootstrap_mean(one_group(np.full((10, 4), 0.5)), resamples=500, seed=1)
    assert iv.degenerate and iv.low == iv.high == iv.point == pytest.approx(0.5)
    same = one_group(np.ones((10, 2)))
    diff = bootstrap_paired_diff(same, same, resamples=500, seed=1)
    assert diff.degenerate and diff.point == 0.0


def test_single_run_resamples_tasks_only() -> None:
    rng = np.random.default_rng(5)
    m = one_group((rng.random((50, 1)) < 0.5).astype(float))
    iv = bootstrap_mean(m, resamples=2000, seed=2)
    assert iv.low < iv.point < iv.high
    sd = np.sqrt(m.point() * (1 - m.point()) / 50)
    assert iv.high - iv.low == pytest.approx(2 * 1.96 * sd, rel=0.15)


def test_paired_difference_is_narrower_than_unpaired_for_correlated_methods() -> None:
    rng = np.random.default_rng(11)
    p = rng.beta(1, 1, 150)
    a = one_group((rng.random((150, 4)) < np.clip(p + 0.1, 0, 1)[:, None]).astype(float))
    b = one_group((rng.random((150, 4)) < p[:, None]).astype(float))
    paired = bootstrap_paired_diff(a, b, resamples=2000, seed=3)
    independent = bootstrap_linear(
        [[(1.0, a)], [(-1.0, b)]], block_weights=[1.0, 1.0], resamples=2000, seed=3
    )
    assert paired.point == pytest.approx(a.point() - b.point())
    assert paired.high - paired.low < independent.high - independent.low


def test_stratified_mean_point_and_task_mismatch() -> None:
    rng = np.random.default_rng(2)
    ms = [one_group(rng.random((n, 2))) for n in (5, 8, 13)]
    iv = bootstrap_stratified_mean(ms, resamples=500, seed=4)
    assert iv.point == pytest.approx(np.mean([m.point() for m in ms]))
    with pytest.raises(ValueError, match="same tasks"):
        bootstrap_paired_diff(ms[0], ms[1], resamples=100, seed=0)


def test_run_shrinkage_small_without_and_large_with_run_effects() -> None:
    rng = np.random.default_rng(8)
    p = rng.beta(2, 3, 500)
    no_effect = one_group((rng.random((500, 4)) < p[:, None]).astype(float))
    shifted = np.clip(p[:, None] + np.array([-0.2, 0.0, 0.1, 0.2])[None, :], 0, 1)
    with_effect = one_group((rng.random((500, 4)) < shifted).astype(float))
    assert no_effect.run_shrinkage() < 0.5
    assert with_effect.run_shrinkage() > 0.9


def test_coverage_by_simulation() -> None:
    """Nominal 95% -> measured coverage in [0.92, 0.98]: Beta task means, Bernoulli runs, k=4, 200 tasks."""
    rng = np.random.default_rng(20260101)
    n_tasks, k, datasets, truth = 200, 4, 300, 2 / 5  # E[Beta(2, 3)]
    hits = 0
    for d in range(datasets):
        p = rng.beta(2, 3, n_tasks)
        m = one_group((rng.random((n_tasks, k)) < p[:, None]).astype(float))
        hits += bootstrap_mean(m, resamples=1000, seed=d).contains(truth)
    assert 0.92 <= hits / datasets <= 0.98
