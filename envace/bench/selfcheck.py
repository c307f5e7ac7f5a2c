"""Gold-replay self-checks: ground-truth calls through the full evaluation runner path.

Implemented: :func:`selfcheck_bfcl_multi_turn` — for every task of the four BFCL multi-turn categories,
a :class:`envace.bench.scripted.ScriptedBackend` replays the task's ground-truth calls (one assistant
message per user turn, then a text answer) through :func:`envace.bench.runner.run_samples` — the same
episode driver, rollout loop (``Mode.REAL``), tool-call parser, structured dispatch and scorer as an
evaluation — and counts passed samples. :func:`selfcheck_bfcl_ast` does the same for the 13 single-turn
(AST) categories through :class:`envace.bench.bfcl.adapter.BfclV4Adapter`: one assistant message with the gold
calls of :func:`envace.bench.bfcl.single_turn.gold_calls` (none for the irrelevance categories), then a text
answer, scored by bfcl-eval's AST checker / relevance rule; it also returns passed/total per category.
All 3641 tasks replay; 3635 pass. The 6 others are tasks whose ground truth no output satisfies under
bfcl-eval's own checker (:data:`envace.bench.bfcl.single_turn.KNOWN_UNSATISFIABLE`); their failed lines carry
``known_unsatisfiable`` (the reason), which the ``envace selfcheck`` command accepts.
Uses the character tokenizer of :mod:`envace.bench.scripted` (see there why). Writes its result file into
a temporary directory.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from envace.bench.bfcl.adapter import BfclMultiTurnAdapter, BfclV4Adapter
from envace.bench.bfcl.common import AST_SPLITS, MULTI_TURN_SPLITS
from envace.bench.bfcl.single_turn import KNOWN_UNSATISFIABLE
from envace.bench.runner import run_samples
from envace.bench.scripted import CharTokenizer, ScriptedBackend, script_for_calls
from envace.core.environment import Services
from envace.core.rollout import Mode, RolloutConfig

__all__ = ["selfcheck_bfcl_multi_turn", "selfcheck_bfcl_ast", "selfcheck_bfcl_agentic",
           "replay_gold", "REPLAY_CONFIG"]

#: roomy limits: the replay must never be cut by a budget (char-level tokens); every gold turn counts
#: toward ``max_turns`` (an evaluation's turn cap).
REPLAY_CONFIG = RolloutConfig(mode=Mode.REAL, max_turns=1000, max_prompt_tokens=10**9,
                              max_response_tokens=10**9, act_sampling={"max_tokens": 10**9},
                              context_budget="episode", turn_cap="every_turn", template_kwargs={})


def selfcheck_bfcl_multi_turn(splits: list[str] | None = None, limit: int | None = None,
                              out_dir: str | Path | None = None) -> tuple[int, int, list[dict]]:
    """Replay ground truth; returns ``(passed, total, failed result lines)``."""
    adapter = BfclMultiTurnAdapter()
    tasks = adapter.load_tasks(list(splits or MULTI_TURN_SPLITS), limit)
    scripts = {t.task_id: script_for_calls(adapter.gold_turns(t)) for t in tasks}
    return replay_gold(adapter, tasks, scripts, "bfcl_multi_turn", out_dir)


def selfcheck_bfcl_ast(splits: list[str] | None = None, limit: int | None = None,
                       out_dir: str | Path | None = None
                       ) -> tuple[int, int, list[dict], dict[str, tuple[int, int]]]:
    """Replay the single-turn ground truth; returns ``(passed, total, failed result lines, {category:
    (passed, total)})``."""
    adapter = BfclV4Adapter()
    tasks = adapter.load_tasks(list(splits or AST_SPLITS), limit)
    scripts = {t.task_id: script_for_calls(adapter.gold_turns(t)) for t in tasks}
    passed, total, failed = replay_gold(adapter, tasks, scripts, "bfcl_ast", out_dir)
    for line in failed:
        if line["task_id"] in KNOWN_UNSATISFIABLE and line["status"] == "ok":  # scored, not crashed
            line["known_unsatisfiable"] = KNOWN_UNSATISFIABLE[line["task_id"]]
    by_split = {}
    for split in dict.fromkeys(t.split for t in tasks):
        n = sum(1 for t in tasks if t.split == split)
        by_split[split] = (n - sum(1 for line in failed if line["split"] == split), n)
    return passed, total, failed, by_split


def selfcheck_ledger(limit: int | None = None, out_dir: str | Path | None = None
                     ) -> tuple[int, int, list[dict], dict[str, tuple[int, int]]]:
    """Replay each ledger task's reference calls and answer (the default generator: seed 0, both
    splits); returns ``(passed, total, failed result lines, {split: (passed, total)})``."""
    from envace.bench.ledger import LedgerAdapter

    adapter = LedgerAdapter()
    tasks = adapter.load_tasks(["train", "test"], limit)
    scripts = {t.task_id: script_for_calls([list(t.meta["ledger_task"].calls)],
                                           f"Done: the balance is {t.meta['ledger_task'].answer}.")
               for t in tasks}
    passed, total, failed = replay_gold(adapter, tasks, scripts, "ledger", out_dir)
    by_split = {s: (sum(1 for t in tasks if t.split == s) - sum(1 for x in failed if x["split"] == s),
                    sum(1 for t in tasks if t.split == s)) for s in ("train", "test")}
    return passed, total, failed, by_split


def selfcheck_bfcl_agentic(splits: list[str] | None = None, limit: int | None = None,
                           out_dir: str | Path | None = None
                           ) -> tuple[int, int, list[dict], dict[str, tuple[int, int]]]:
    """Replay the agentic categories (:func:`envace.bench.bfcl.agentic.gold_turns`): memory with the
    deterministic in-process encoder, web search in replay mode from the cache of
    :func:`envace.bench.bfcl.agentic.gold_cache_records`. Returns ``(passed, total, failed result lines,
    {category: (passed, total)})``; a prerequisite conversation that did not end normally counts as a
    failed line too (its memory feeds the questions)."""
    import json

    from envace.bench.bfcl.agentic import gold_answer, gold_cache_records, load_agentic_tasks
    from envace.bench.bfcl.common import AGENTIC_SPLITS
    from envace.bench.runner import prerequisite_path
    from envace.common.results import read_results

    splits = list(splits or AGENTIC_SPLITS)
    with tempfile.TemporaryDirectory(prefix="envace-selfcheck-agentic-") as tmp:
        work = Path(out_dir or tmp)
        cache = work / "gold_web_cache.jsonl"
        web_tasks = [t for s in splits if s.startswith("web_search") for t in load_agentic_tasks(s, limit)]
        records = gold_cache_records(web_tasks)
        cache.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        config = {"splits": splits, "memory": {"encoder": "hashing"},
                  "web_search": {"mode": "replay", "cache": str(cache)}}
        adapter = BfclV4Adapter(config, work_dir=work / "work")
        tasks = adapter.load_tasks(splits, limit)
        scripts = {t.task_id: script_for_calls(adapter.gold_turns(t), gold_answer(t)) for t in tasks}
        passed, total, failed = replay_gold(adapter, tasks, scripts, "bfcl_agentic", work)
        pre = read_results(prerequisite_path(work / "bfcl_agentic_selfcheck.jsonl")).lines
    failed += [line for line in pre if line["status"] != "ok"]
    by_split = {}
    for split in splits:
        n = sum(1 for t in tasks if t.split == split and not t.meta["prerequisite"])
        by_split[split] = (n - sum(1 for x in failed if x["split"] == split and "prerequisite" not in
                                   x.get("extra", {})), n)
        n_pre = sum(1 for t in tasks if t.split == split and t.meta["prerequisite"])
        if n_pre:
            bad = sum(1 for x in failed if x["split"] == split and "prerequisite" in x.get("extra", {}))
            by_split[f"{split} (prerequisite conversations)"] = (n_pre - bad, n_pre)
    return passed, total, failed, by_split


def replay_gold(adapter: Any, tasks: list[Any], scripts: dict[str, Any], name: str,
                out_dir: str | Path | None = None) -> tuple[int, int, list[dict]]:
    """Run each task's scripted gold agent (``scripts[task_id]``) through the full runner; a sample
    passes with status ok and score 1.0. Returns ``(passed, total, failed result lines)``."""
    from envace.common.results import read_results

    tokenizer = CharTokenizer()
    with tempfile.TemporaryDirectory(prefix="envace-selfcheck-") as tmp:
        out = Path(out_dir or tmp) / f"{name}_selfcheck.jsonl"
        path, _ = asyncio.run(run_samples(
            adapter=adapter, tasks=tasks, samples=1, seed=0, services=Services(),
            backend_for=lambda task, sample: ScriptedBackend(scripts[task.task_id], tokenizer),
            tokenizer=tokenizer, config=REPLAY_CONFIG, out=out,
            manifest={"model": "gold", "scale": "smoke", "config_hash": "0" * 16,
                      "git_commit": "", "package_versions": adapter.versions()},
            progress=False, keep_trajectory=False,
        ))
        lines = read_results(path).lines
    failed = [line for line in lines if line["status"] != "ok" or line["score"] != 1.0]
    return len(lines) - len(failed), len(lines), failed
