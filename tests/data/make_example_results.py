"""Generate the small, deterministic example result set in ``tests/data/example_results/``.

Covers ``tests/data/example_config.yaml``: every Table 1/2 model x benchmark with 2 seeds (Avg@2),
3 tasks per split (tau2 with 2 samples per task and run), the step-2 checkpoint of ``envace_8b`` and all
13 test-time-scaling settings (1 seed). Outcomes are Bernoulli draws (fractions for VitaBench; for
FinMCP tool-name counts TP/FP/FN in ``extra`` with tp/tr/tf1 derived from them) around a per-model
skill; each file's generator is seeded from its path, so the files do not
depend on generation order. Deliberately absent: ``scaleenv_8b`` on bfcl_v4, bfcl_v4's ``web_search_base``
split. (Figure 5's last step, 4, is the final model ``envace_8b``: no checkpoint id.) One sample
(envace_1p7b, tau2, seed 1, airline_0, sample 0) is a failure.

Models without a listed skill get one derived from their name.

Every line of a TTS setting other than ``no_tts`` carries ``extra["tts"]``: a record shaped like
``envace.core.tts.TTSRecord.as_dict()`` whose token counts are **synthetic** (``"synthetic": true``, prompt
version ``synthetic-example``; no model ran): attempts and memory grow with N, sequential attempts see
the earlier ones, and the commit's context is its prompt (task + memory) plus 2-4 turns. They come from
a second generator seeded from the path, so the scores are the same draws as without them.

Run from the repository root: ``python tests/data/make_example_results.py``.
"""

from __future__ import annotations

import argparse
import shutil
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from envace.bench.finmcp import sample_metrics
from envace.common.config import eval_hash, evaluation_pairs, load_config, tts_hash
from envace.common.results import eval_path, tts_path, write_results

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "example_config.yaml"
OUT = HERE / "example_results"
TASKS_PER_SPLIT = 3
SAMPLES = {"tau2": 2}
ABSENT_SPLITS = {"web_search_base"}
ABSENT_EVALS = {("scaleenv_8b", "bfcl_v4")}
FAILED = ("envace_1p7b", "tau2", 1, "airline_0", 0)
SKILL = {
    "qwen3_8b": 0.35,
    "awm_8b": 0.40,
    "envscaler_8b": 0.45,
    "scaleenv_8b": 0.45,
    "envace_1p7b": 0.30,
    "envace_8b": 0.60,
    "grpo_1p7b": 0.20,
    "grpo_8b": 0.40,
    "per_role_8b": 0.50,
    "envace_8b-step0002": 0.45,
    "no_tts": 0.45,
}
TTS_SKILL = {"parallel": {"envace": 0.50, "base": 0.45}, "sequential": {"envace": 0.48, "base": 0.40}}
TTS_N = {1: 0.0, 2: 0.1, 3: 0.0}
STAMP = "2026-01-01T00:00:00+00:00"
TASK_TOKENS = {"tau2": 1200, "bfcl_multi_turn": 900}  # synthetic commit prompt without memory
SYNTHETIC_NOTE = "synthetic example record: token counts are made up, no model ran"


def _skill(name: str) -> float:
    if name in SKILL:
        return SKILL[name]
    parts = name.split("_")
    if len(parts) == 3 and parts[0] in TTS_SKILL:
        mode, n, rehearser = parts
        return TTS_SKILL[mode][rehearser] + TTS_N[int(n[1:])]
    return 0.15 + 0.4 * (zlib.crc32(name.encode()) % 100) / 100


def _tts_setting(name: str) -> tuple[str, int] | None:
    """``(mode, N)`` of a TTS setting id such as ``parallel_n2_envace``; ``None`` otherwise."""
    parts = name.split("_")
    if len(parts) == 3 and parts[0] in TTS_SKILL and parts[1][:1] == "n" and parts[1][1:].isdigit():
        return parts[0], int(parts[1][1:])
    return None


def _tts_record(rng: np.random.Generator, mode: str, n: int, bench: str, memory_cap: int) -> dict[str, Any]:
    """A synthetic ``TTSRecord.as_dict()`` (see the module docstring)."""
    task = TASK_TOKENS.get(bench, 1000) + int(rng.integers(-100, 101))
    attempts = []
    seen = 0  # tokens of earlier attempts a sequential attempt is shown
    for i in range(n):
        prompt = task + (seen if mode == "sequential" else 0)
        grown = int(rng.integers(200, 401))
        seen += grown // 2
        attempts.append(
            {
                "index": i,
                "termination": "final_answer",
                "num_turns": int(rng.integers(2, 5)),
                "prompt_tokens": prompt,
                "context_tokens": prompt + grown,
                "rehearse_context_tokens": prompt + grown // 2,
                "generated_tokens": grown,
                "final_answer": "(synthetic)",
                "transcript": "(synthetic)",
                "transcript_truncated": False,
                "evaluation": {"success": bool(rng.random() < 0.5), "feedback": "(synthetic)",
                               "fallback": False, "reason": None},
                "eval_prompt_tokens": prompt + grown,
            }
        )
    per_attempt = 1.3 if mode == "sequential" else 1.0
    memory = min(memory_cap, int(sum(rng.integers(40, 81) for _ in range(n)) * per_attempt))
    commit, context = [], task + memory
    for _ in range(int(rng.integers(2, 5))):
        context += int(rng.integers(80, 201))
        commit.append(context)
        context += int(rng.integers(20, 61))  # the observation before the next turn
    return {
        "synthetic": True,
        "note": SYNTHETIC_NOTE,
        "mode": mode,
        "n": n,
        "prompt_version": "synthetic-example",
        "attempts": attempts,
        "summary_text": None,
        "summary_prompt_tokens": sum(a["context_tokens"] for a in attempts),
        "summary_fallback": False,
        "summary_fallback_reason": None,
        "memory": "(synthetic)",
        "memory_tokens": memory,
        "memory_truncated": memory == memory_cap,
        "memory_placement": "system_suffix",
        "commit_context_tokens": commit,
        "commit_prompt_tokens": task + memory,
        "commit_final_context_tokens": commit[-1],
        "fallbacks": {"evaluation": 0, "summary": 0},
        "attempt_context_tokens": [a["context_tokens"] for a in attempts],
    }


def _lines(cfg: dict[str, Any], name: str, bench: str, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(zlib.crc32(f"{name}/{bench}/{seed}".encode()))
    tts = _tts_setting(name)
    tts_rng = np.random.default_rng(zlib.crc32(f"tts-context/{name}/{bench}/{seed}".encode()))
    skill = _skill(name)
    rows = []
    for split in cfg["benchmarks"][bench]["splits"]:
        if split in ABSENT_SPLITS:
            continue
        for i in range(TASKS_PER_SPLIT):
            task = f"{split}_{i}"
            for sample in range(SAMPLES.get(bench, 1)):
                subscores: dict[str, float] = {}
                counts: dict[str, int] = {}
                if bench == "finmcp":  # tool-name counts (envace.bench.finmcp), metrics derived from them
                    gold, pred = (int(x) for x in rng.integers(1, 7, size=2))
                    hit = int(rng.binomial(min(gold, pred), skill))
                    counts = {"TP": hit, "FP": pred - hit, "FN": gold - hit}
                    subscores = sample_metrics(["t"] * hit + ["p"] * (pred - hit),
                                               ["t"] * hit + ["g"] * (gold - hit))
                    score = subscores["tf1"]
                elif bench == "vitabench":
                    score = round(float(np.clip(rng.normal(skill, 0.25), 0.0, 1.0)), 2)
                else:
                    score = float(rng.random() < skill)
                failed = (name, bench, seed, task, sample) == FAILED
                rows.append(
                    {
                        "benchmark": bench,
                        "split": split,
                        "task_id": task,
                        "sample": sample,
                        "seed": seed,
                        "score": 0.0 if failed else score,
                        "subscores": subscores,
                        "status": "failed" if failed else "ok",
                        "reason": "timeout" if failed else None,
                        **({"extra": counts} if counts else {}),
                    }
                )
                if tts is not None:
                    record = _tts_record(tts_rng, *tts, bench, int(cfg["tts"]["memory_max_tokens"]))
                    rows[-1]["extra"] = {"tts": record}
    return rows


def _write(cfg: dict[str, Any], path: Path, name: str, bench: str, seed: int, config_hash: str) -> None:
    write_results(
        path,
        _lines(cfg, name, bench, seed),
        model=name,
        benchmark=bench,
        seed=seed,
        scale=cfg["scale"],
        config_hash=config_hash,
        started=STAMP,
        finished=STAMP,
        git_commit="0000000000000000000000000000000000example",
        package_versions={"envace": "0.1.0"},
    )


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    cfg = load_config(CONFIG)
    out = OUT
    shutil.rmtree(out, ignore_errors=True)
    evals = set(evaluation_pairs(cfg))  # Figure 5: envace_8b-step0002; its step 4 is envace_8b (final)
    for model, bench in sorted(evals - ABSENT_EVALS):
        for seed in cfg["seeds"]:
            _write(cfg, eval_path(out, model, bench, seed), model, bench, seed, eval_hash(cfg, model, bench))
    for setting in cfg["tts"]["settings"]:
        for bench in cfg["tts"]["benchmarks"]:
            for seed in cfg["tts"]["seeds"]:
                _write(
                    cfg,
                    tts_path(out, setting, bench, seed),
                    setting,
                    bench,
                    seed,
                    tts_hash(cfg, setting, bench),
                )
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"make_example_results: wrote {out} ({size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
