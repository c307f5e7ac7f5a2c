"""``benchmarks/render_digest.py`` on the tiny tokenizer: one digest per rendering of each prefix that ends
at a non-assistant turn (tools on/off x thinking on/off), the same on a second run."""

from __future__ import annotations

import json
import re

import transformers

from tests.fixtures import WEATHER_TOOL

CALL = {"name": "get_weather", "arguments": {"city": "Oslo"}}
RECORD = {
    "tools": [WEATHER_TOOL],
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": CALL}]},
        {"role": "tool", "content": '{"temp": 4}'},
        {"role": "assistant", "content": "4 degrees."},
    ],
}


def test_digests_of_every_rendering(script, tokenizer, tmp_path, capsys) -> None:
    tokenizer.save_pretrained(tmp_path / "tok")
    records = tmp_path / "records.jsonl"
    records.write_text(json.dumps(RECORD) + "\nnot json\n" + json.dumps(RECORD) + "\n")
    argv = [str(tmp_path / "tok"), str(records), "--limit", "2"]
    digest = script("render_digest")
    runs = []
    for _ in range(2):
        assert digest.main(argv) == 0
        runs.append(json.loads(capsys.readouterr().out))
    assert runs[0] == runs[1]
    assert runs[0]["transformers"] == transformers.__version__
    renderings = runs[0]["renderings"]
    assert len(renderings) == 3 * 4 + 1  # --limit 2: the first record (3 prefixes) and the unreadable line
    assert renderings[-1] == "unreadable record"
    assert all(re.fullmatch(r"[0-9a-f]{16}", r) for r in renderings[:-1]), renderings
    assert len(set(renderings[:-1])) > 1
