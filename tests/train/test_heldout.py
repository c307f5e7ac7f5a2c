"""envace.train.heldout: the held-out evaluator of the learning test and the ledger scripts."""

from __future__ import annotations

import pytest

from envace.bench.ledger import LedgerAdapter, generate_tasks, reference_record
from envace.serve.tiny_model import tiny_model_and_tokenizer
from envace.train.heldout import by_task, load_model, paired_gain, reference_fidelity, task_success


@pytest.fixture(scope="module")
def tiny():
    return tiny_model_and_tokenizer(seed=0)


def test_by_task_groups_values_in_order_or_averages_them() -> None:
    items = [("a", 1), ("b", 0), ("a", 0), ("a", 0.5)]
    assert by_task(items) == {"a": [1.0, 0.0, 0.5], "b": [0.0]}
    assert by_task(items, mean=True) == {"a": [0.5], "b": [0.0]}


def test_paired_gain_pairs_by_task_and_ignores_unshared_ones() -> None:
    before = {f"t{i}": [0.0, 0.0] for i in range(20)}
    after = {f"t{i}": [1.0, 1.0] if i < 10 else [0.0, 0.0] for i in range(20)} | {"only_after": [1.0, 1.0]}
    gain = paired_gain(after, before, resamples=500, seed=1)
    assert gain.point == pytest.approx(0.5)
    assert 0.0 < gain.low < 0.5 < gain.high <= 1.0
    flat = paired_gain(before, before, resamples=100)
    assert flat.degenerate and flat.point == 0.0
    with pytest.raises(ValueError, match="share no task"):
        paired_gain({"x": [1.0]}, {"y": [0.0]})
    with pytest.raises(ValueError, match="after's tasks hold different sample counts"):
        paired_gain({"x": [1.0], "y": [1.0, 0.0]}, {"x": [0.0], "y": [0.0]})


def test_task_success_runs_every_sample_in_the_real_ledger(tiny) -> None:
    model, tokenizer = tiny
    adapter = LedgerAdapter({"ledger": {"seed": 0, "n_train": 4, "n_test": 3}})
    lines = task_success(model, tokenizer, adapter, samples=2, temperature=1.0, seed=0)
    assert sorted((x["task_id"], x["sample"]) for x in lines) == sorted(
        (t.task_id, s) for t in adapter.load_tasks(["test"], None) for s in range(2))
    # an untrained model makes no valid call and states no right balance: the real ledger scores 0
    assert all(x["score"] == 0.0 and set(x["subscores"]) >= {"state", "answer"} for x in lines)


def test_reference_fidelity_scores_each_reference_call(tiny) -> None:
    model, tokenizer = tiny
    tasks = generate_tasks(0, 4, 3)["test"]
    scores = reference_fidelity(model, tokenizer, [reference_record(t) for t in tasks])
    assert [s.task_id for s in scores] == [t.task_id for t in tasks for _ in t.calls]
    assert [s.tool for s in scores] == [c.name for t in tasks for c in t.calls]
    assert all(s.real_kind == "success" for s in scores)  # the reference calls all succeed
    assert all(s.exact == 0.0 for s in scores)  # an untrained model does not rehearse the ledger
    shown = reference_fidelity(model, tokenizer, [reference_record(t) for t in tasks], with_references=True)
    assert [(s.task_id, s.tool) for s in shown] == [(s.task_id, s.tool) for s in scores]


def test_load_model_round_trips_and_names_a_bad_folder(tiny, tmp_path) -> None:
    model, tokenizer = tiny
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    loaded, tok = load_model(tmp_path / "m")
    assert not loaded.training and tok.eos_token_id == tokenizer.eos_token_id
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(tmp_path)
