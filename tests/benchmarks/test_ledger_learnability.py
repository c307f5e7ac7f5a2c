"""``benchmarks/ledger_learnability.py`` at two SFT steps on a few ledger tasks: a Markdown row at the
evaluation step with the loss and the held-out rates, and the saved model; its rehearsal-fidelity cell
(``--fidelity``: every held-out task, ~15 s) on two tasks."""

from __future__ import annotations

import math
import re

from envace.bench.ledger import generate_tasks
from envace.serve.tiny_model import tiny_model_and_tokenizer


def _assert_rates(cell: str) -> None:
    """``"a / b / c"``: three rates in [0, 1]."""
    values = [float(x) for x in cell.split(" / ")]
    assert len(values) == 3 and all(0 <= x <= 1 for x in values), cell


def test_two_steps_evaluated_and_saved(script, tmp_path, capsys) -> None:
    save = tmp_path / "warm"
    script("ledger_learnability").main([
        "--steps", "2", "--eval-at", "2", "--n-train", "4", "--batch-rows", "2", "--samples", "1",
        "--temperatures", "1.0", "--template-variants", "plain", "--save", str(save),
        "--behaviours", "act,answer,rehearse,memory", "--hidden-references", "1", "--rehearsal-prompt",
        "rehearsal_compact"])
    out = capsys.readouterr().out
    assert "| step | SFT s | loss | default T=1.0 success / transfer state / answer |" in out
    rows = [line.strip("|").split("|") for line in out.splitlines() if re.match(r"\| \d+ \|", line)]
    assert len(rows) == 1, out
    step, seconds, loss, rates = rows[0]
    assert int(step) == 2 and float(seconds) >= 0 and math.isfinite(float(loss)) and float(loss) > 0
    _assert_rates(rates)
    assert (save / "config.json").is_file() and (save / "tokenizer.json").is_file()


def test_fidelity_cell(script) -> None:
    tasks = generate_tasks(seed=0, n_train=2, n_test=2)["test"]
    model, tokenizer = tiny_model_and_tokenizer(0)
    _assert_rates(script("ledger_learnability").fidelity(model, tokenizer, tasks, "training"))
    compact = script("ledger_learnability").fidelity(model, tokenizer, tasks, "training", "rehearsal_compact")
    _assert_rates(compact)
