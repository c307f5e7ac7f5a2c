"""CM2 conversion on the hand-written fixture: normalisation, bad records, filtering, parquet round trip."""

from __future__ import annotations

import json

import pytest

from envace.cli import main
from envace.config import load_config
from envace.data import (
    BadRecord,
    convert,
    count_prompt_tokens,
    normalize_record,
    read_training_parquet,
    write_training_parquet,
)

from .conftest import FIXTURE


def _lines() -> list[str]:
    return FIXTURE.read_text().splitlines()


def test_bad_records_are_counted_with_index_and_reason(converted):
    examples, summary = converted
    lines = _lines()
    bad_expected = []
    for i, line in enumerate(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            bad_expected.append(i)
            continue
        turns = [t["items"] if isinstance(t, dict) else t for t in rec["checklists"]]
        if "tools" not in rec or any(sum(it["weight"] for it in items) == 0 for items in turns):
            bad_expected.append(i)
    assert [b["index"] for b in summary.bad] == bad_expected
    assert all(b["reason"] for b in summary.bad)
    assert summary.total == len(lines)
    assert summary.kept == len(examples) == len(lines) - len(bad_expected)


def test_prompt_is_initial_chat_and_references_are_privileged(converted):
    examples, _ = converted
    by_uid = {e.uid: e for e in examples}
    ex = by_uid["fx-order-0"]
    # system + first user only; later user turns are not part of the prompt
    assert [m["role"] for m in ex.prompt] == ["system", "user"]
    assert "order 12345" in ex.prompt[-1]["content"]
    assert ex.reference_calls == [{"name": "order_status", "arguments": {"order_id": "12345"}}]
    assert ex.references[0]["response"]["status"] == "shipped"
    assert len(ex.checklists) == 2  # one per user turn
    for turn in ex.checklists:
        assert sum(item["weight"] for item in turn) == pytest.approx(1.0)
    # tools given as a JSON string are decoded
    assert ex.tools[0]["function"]["name"] == "order_status"


def test_parallel_calls_matched_by_tool_call_id(converted):
    examples, _ = converted
    ex = next(e for e in examples if e.uid == "fx-weather-par")
    pairs = {r["call"]["arguments"]["city"]: r["response"]["city"] for r in ex.references}
    assert pairs == {"Paris": "Paris", "Rome": "Rome"}


def test_weights_rescaled_to_one(converted):
    examples, _ = converted
    ex = next(e for e in examples if e.uid == "fx-add-0")  # raw weights 2 and 1
    assert [round(i["weight"], 6) for i in ex.checklists[0]] == [round(2 / 3, 6), round(1 / 3, 6)]


@pytest.mark.parametrize("record, reason", [
    ({"tools": [{"name": "f"}], "messages": [{"role": "assistant", "content": "x"}], "checklists": [[]]},
     "first non-system message"),
    ({"tools": [{"name": "f"}], "messages": [{"role": "user", "content": "q"},
                                            {"role": "tool", "content": "{}"}],
      "checklists": [[{"question": "q?"}]]}, "answers no call"),
    ({"tools": [{"name": "f"}], "messages": [{"role": "user", "content": "q"},
                                            {"role": "assistant", "tool_calls": [
                                                {"function": {"name": "f", "arguments": "{bad"}}]}],
      "checklists": [[{"question": "q?"}]]}, "not JSON"),
    ({"tools": [{"name": "f"}], "messages": [{"role": "user", "content": "q"}],
      "checklists": [[{"question": "a?"}], [{"question": "b?"}]]}, "2 checklists for 1 user turns"),
])
def test_normalize_rejects(record, reason):
    with pytest.raises(BadRecord, match=reason):
        normalize_record(record, 0)


def test_length_filter_uses_the_tokenizer(tokenizer, converted):
    examples, _ = converted
    lengths = sorted(e.prompt_tokens for e in examples)
    cut = lengths[len(lengths) // 2]
    kept, summary = convert(str(FIXTURE), tokenizer, cut)
    assert all(e.prompt_tokens <= cut for e in kept)
    assert len(summary.filtered) == sum(n > cut for n in lengths)
    assert all(f["prompt_tokens"] > cut for f in summary.filtered)
    assert examples[0].prompt_tokens == count_prompt_tokens(tokenizer, examples[0])


def test_parquet_round_trip(tmp_path, converted):
    examples, _ = converted
    path = tmp_path / "train.parquet"
    write_training_parquet(examples, path)
    back = read_training_parquet(path)
    assert back == examples
    import pyarrow.parquet as pq

    cols = set(pq.read_table(path).column_names)
    assert {"prompt", "data_source", "reward_model", "extra_info"} <= cols


def test_missing_local_source_is_a_clear_error(tokenizer, tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        convert(str(tmp_path / "nope.jsonl"), tokenizer, 100)


def test_data_cli(tmp_path, repo_root, monkeypatch, converted):
    monkeypatch.chdir(repo_root)
    out, summary = tmp_path / "d.parquet", tmp_path / "s.json"
    rc = main(["data", "--config", "config/smoke.yaml", "--out", str(out), "--summary", str(summary)])
    assert rc == 0
    s = json.loads(summary.read_text())
    assert s["kept"] == len(read_training_parquet(out)) == len(converted[0])
    assert s["n_bad"] == len(converted[1].bad)


def test_validation_split_is_held_out(tmp_path, repo_root, monkeypatch, converted):
    """training.data.val_examples (paper: 100, authors' script): the last N usable records form verl's
    validation parquet and are not trained on."""
    monkeypatch.chdir(repo_root)
    out, val, summary = tmp_path / "t.parquet", tmp_path / "v.parquet", tmp_path / "s.json"
    rc = main(["data", "--config", "config/smoke.yaml", "--out", str(out), "--val-out", str(val),
               "--summary", str(summary)])
    assert rc == 0
    train_ids = [e.uid for e in read_training_parquet(out)]
    val_ids = [e.uid for e in read_training_parquet(val)]
    n_val = load_config("config/smoke.yaml")["training"]["data"]["val_examples"]
    assert len(val_ids) == n_val and not set(train_ids) & set(val_ids)
    assert train_ids + val_ids == [e.uid for e in converted[0]]
    assert json.loads(summary.read_text())["val_examples"] == n_val
