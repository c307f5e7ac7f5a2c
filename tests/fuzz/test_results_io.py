"""Property tests of result writing and reading: the per-sample writer never raises on what a line holds
and always writes something the readers take back; the readers turn any damage into ResultsError (or, for
the partial file of a resumed run, into dropped lines), never into another exception."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envace.bench.runner import PartialResults
from envace.common.results import (
    MAX_LINE_DEPTH,
    REPAIR_KINDS,
    ResultsError,
    encode_json,
    encode_line,
    line_problem,
    read_results,
    write_results,
)

from .strategies import any_text, depth_of, has_non_finite, has_surrogate, hostile_values, json_values

HASH = "0123456789abcdef"
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _reject(name: str) -> None:
    raise AssertionError(f"the writer wrote the non-JSON constant {name}")


def _clean(value: object) -> bool:
    try:
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (ValueError, TypeError, RecursionError):
        return False
    return depth_of(value) <= MAX_LINE_DEPTH


@SETTINGS
@given(hostile_values)
def test_encode_json_never_raises_and_is_readable(value: object) -> None:
    text, repairs = encode_json(value)
    text.encode("utf-8")
    decoded = json.loads(text, parse_constant=_reject)
    assert depth_of(decoded) <= MAX_LINE_DEPTH + 1
    assert set(repairs) <= set(REPAIR_KINDS) and all(n > 0 for n in repairs.values())
    if has_surrogate(value):
        assert repairs.get("lone_surrogates")
    if has_non_finite(value):
        assert repairs.get("non_finite_numbers")


@SETTINGS
@given(json_values)
def test_clean_values_are_written_as_json_dumps_writes_them(value: object) -> None:
    text, repairs = encode_json(value)
    if _clean(value):
        assert repairs == {} and text == json.dumps(value, ensure_ascii=False)
        assert json.loads(text) == value or has_non_finite(value)
    else:
        assert repairs


def _line(task: str, sample: int, free: object, reason: object) -> dict:
    return {"benchmark": "toy", "split": "s", "task_id": task, "sample": sample, "seed": 0, "score": 0.5,
            "subscores": {"a": 1.0}, "status": "ok", "reason": reason,
            "trajectory": {"messages": [{"role": "assistant", "content": free}]}, "extra": {"x": free}}


free_fields = st.lists(st.tuples(hostile_values, st.one_of(st.none(), any_text(12))), min_size=1, max_size=4)


@SETTINGS
@given(free_fields)
def test_the_per_sample_writer_never_raises_and_resume_reads_back_what_it_wrote(items: list) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.jsonl"
        partial = PartialResults(out, HASH)
        stored = [partial.append(_line(f"t{i}", 0, free, reason)) for i, (free, reason) in enumerate(items)]
        for i, (line, (free, reason)) in enumerate(zip(stored, items, strict=True)):
            assert line_problem(line) is None
            # clean = the whole line as written (free sits 4 levels deep in it: the depth limit is the line's)
            assert ("json_repairs" in line) == (not _clean(_line(f"t{i}", 0, free, reason)))
        resumed = PartialResults(out, HASH)
        assert list(resumed.lines.values()) == stored
        path = write_results(out, stored, model="m", benchmark="toy", seed=0, scale="smoke", config_hash=HASH,
                             git_commit="x", package_versions={})
        assert read_results(path, expected_hash=HASH).lines == stored


@SETTINGS
@given(free_fields)
def test_encoding_a_repaired_line_again_changes_nothing(items: list) -> None:
    free, reason = items[0]
    first, _ = encode_line(_line("t", 0, free, reason))
    again, repairs = encode_line(json.loads(first))
    assert again == first and repairs == {}


def _example_file(directory: Path) -> Path:
    lines = [_line(f"t{i}", s, {"é": [1, 2.5, "\u2603"]}, None) for i in range(3) for s in range(2)]
    return write_results(directory / "seed0.jsonl", lines, model="m", benchmark="toy", seed=0, scale="smoke",
                         config_hash=HASH, git_commit="x", package_versions={})


CHUNKS = [b"\xff", b"\xc3", b"\x00", b"\n", b"{", b"]", b'"', b"NaN", b"[" * 5000, b"\xed\xa0\x80"]
damage = st.lists(
    st.tuples(st.sampled_from(["insert", "replace", "delete", "truncate"]), st.integers(0, 10**6),
              st.sampled_from(CHUNKS)),
    min_size=1, max_size=4)


def _damaged(data: bytes, edits: list) -> bytes:
    buf = bytearray(data)
    for op, pos, chunk in edits:
        pos = pos % (len(buf) + 1)
        if op == "insert":
            buf[pos:pos] = chunk
        elif op == "replace":
            buf[pos:pos + len(chunk)] = chunk
        elif op == "delete":
            del buf[pos:pos + 7]
        else:
            del buf[pos:]
    return bytes(buf)


@SETTINGS
@given(damage)
def test_read_results_turns_any_damage_into_a_results_error(edits: list) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = _example_file(Path(tmp))
        path.write_bytes(_damaged(path.read_bytes(), edits))
        try:
            res = read_results(path, expected_hash=HASH)
        except ResultsError as exc:
            assert str(path) in str(exc)
        else:
            assert all(line_problem(line) is None for line in res.lines)


@SETTINGS
@given(damage)
def test_a_damaged_partial_file_keeps_a_prefix_and_never_raises(edits: list) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.jsonl"
        partial = PartialResults(out, HASH)
        written = [partial.append(_line(f"t{i}", 0, "x", None)) for i in range(4)]
        partial.path.write_bytes(_damaged(partial.path.read_bytes(), edits))
        resumed = PartialResults(out, HASH)
        kept = list(resumed.lines)
        for line in resumed.lines.values():
            assert line_problem(line) is None and math.isfinite(line["score"])
        original = [(line["task_id"], line["sample"]) for line in written]
        assert kept == original[: len(kept)] or set(kept) - set(original)  # damage may forge a valid line
        resumed.append(_line("new", 0, "y", None))  # the resumed file is writable again
        assert ("new", 0) in PartialResults(out, HASH).lines
