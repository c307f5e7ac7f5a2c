"""The authors' released weights through our evaluators (config ``released``): the released-weights view
of the report, the diff's side-by-side section and ``envace diff --released-only``."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from envace.common.config import complete_config, eval_hash, tts_hash
from envace.common.results import eval_path, read_results, tts_path, write_results
from envace.report.context import ReportContext
from envace.report.diff import build_diff

from .conftest import run_cli

RELEASED = "envace_8b_released"


@pytest.fixture
def released_cfg(cfg: dict) -> dict:
    raw = copy.deepcopy(cfg)
    raw["models"][RELEASED] = {"label": "EnvACE-8B (released weights)", "kind": "hf",
                               "path": "Team-ACE/EnvACE-Qwen3-8B", "size": "8B"}
    raw["released"] = {"envace_8b": RELEASED}
    return complete_config(raw)


def _copy_as(cfg: dict, results: Path, kind: str, name: str, new: str, bench: str, score: float) -> None:
    """``name``'s result files stored again as ``new`` (its own hash), every sample scored ``score``."""
    seeds = cfg["seeds"] if kind == "eval" else cfg["tts"]["seeds"]
    where = eval_path if kind == "eval" else tts_path
    for seed in seeds:
        old = read_results(where(results, name, bench, seed))
        lines = [{**line, "score": score, "status": "ok", "reason": None} for line in old.lines]
        chash = eval_hash(cfg, new, bench) if kind == "eval" else tts_hash(cfg, new, bench)
        write_results(where(results, new, bench, seed), lines, model=new, benchmark=bench, seed=seed,
                      scale=cfg["scale"], config_hash=chash, git_commit="test", package_versions={})


@pytest.fixture
def released_results(released_cfg: dict, results_copy: Path) -> Path:
    for bench in ("bfcl_v4", "tau2", "vitabench", "finmcp"):
        _copy_as(released_cfg, results_copy, "eval", "envace_8b", RELEASED, bench, 1.0)
    for setting in released_cfg["tts"]["settings"]:
        for bench in released_cfg["tts"]["benchmarks"]:
            _copy_as(released_cfg, results_copy, "tts", setting, f"released-{setting}", bench, 1.0)
    return results_copy


def test_released_settings_and_hashes(released_cfg: dict) -> None:
    """The released TTS suite: every paper setting again with the prefix, hashed with the released
    actor and EnvACE rehearser in place of ours (so its results never mix with ours)."""
    from envace.common.config import tts_models

    settings = released_cfg["tts"]["settings"]
    assert released_cfg["tts"]["released_settings"] == [f"released-{s}" for s in settings]
    assert tts_models(released_cfg, "released-parallel_n2_envace") == (
        RELEASED, {"envace": RELEASED, "base": "qwen3_8b"})
    assert tts_models(released_cfg, "parallel_n2_envace") == ("envace_8b", {"envace": "envace_8b",
                                                                           "base": "qwen3_8b"})
    assert tts_hash(released_cfg, "released-no_tts", "tau2") != tts_hash(released_cfg, "no_tts", "tau2")


def test_diff_shows_paper_released_and_ours_side_by_side(released_cfg: dict, released_results: Path) -> None:
    diff = build_diff(ReportContext(released_cfg, released_results, resamples=200))
    section = diff["released"]
    assert section["models"] == {"envace_8b": RELEASED}
    rows = {(e["table"], e["row"], e["column"]): e for e in section["entries"]}
    tau2 = rows[("table1", "EnvACE-8B", "tau2")]
    ours = next(e for e in diff["entries"] if (e["table"], e["row"], e["column"]) == ("table1", "EnvACE-8B",
                                                                                        "tau2"))
    assert tau2["ours"] == pytest.approx(100.0) and tau2["ours_trained"] == ours["ours"] < 99
    assert {e["table"] for e in section["entries"]} == {"table1", "table2", "table3"}
    assert {e["row"] for e in section["entries"] if e["table"] == "table1"} == {"EnvACE-8B"}
    assert rows[("table3", "parallel_envace", "tau2")]["ours"] == pytest.approx(100.0)  # the released suite
    # a claim on a trained model of ours without a released checkpoint: MISSING, saying why
    grpo = next(c for c in section["claims"] if c["id"] == "rehearsal_beats_grpo")
    assert grpo["status"] == "MISSING"
    assert "not part of the released-weights view" in json.dumps(grpo["comparisons"])
    md = (Path(released_results) / "diff.md")
    from envace.report.diff import to_markdown

    md.write_text(to_markdown(diff))
    text = md.read_text()
    assert "The authors' released weights through our evaluators" in text and "| ours (trained) |" in text


def test_released_only_reads_no_model_we_train(tmp_path: Path, released_cfg: dict,
                                               released_results: Path) -> None:
    """``envace diff --released-only``: the section alone, without the trained ours column; a config
    without ``released`` is a clear error."""
    import yaml

    config = tmp_path / "released.yaml"
    raw = {k: v for k, v in released_cfg.items()}
    raw["tts"] = {k: v for k, v in raw["tts"].items() if k not in ("settings", "released_settings")}
    config.write_text(yaml.safe_dump(raw))
    out = tmp_path / "released_diff.md"
    assert run_cli(["diff", "--released-only", "--config", str(config), "--results-dir",
                    str(released_results), "--resamples", "200", "--out-md", str(out)]) == 0
    doc = json.loads(out.with_suffix(".json").read_text())
    assert all(e["ours_trained"] is None for e in doc["entries"])
    assert "ours (trained)" not in out.read_text()
    raw.pop("released")
    config.write_text(yaml.safe_dump(raw))
    assert run_cli(["diff", "--released-only", "--config", str(config), "--results-dir",
                    str(released_results), "--out-md", str(out)]) == 4


@pytest.mark.parametrize(
    ("released", "message"),
    [
        ({"envace_99b": "qwen3_8b"}, "'released' names unknown model 'envace_99b'"),
        ({"envace_8b": "nope"}, "'released.envace_8b' names unknown model 'nope'"),
        ({"envace_8b": "grpo_8b"}, "a model of ours"),
        ({"envace_8b": "envace_8b"}, "must name another model"),
    ],
)
def test_released_names_known_models(cfg: dict, released: dict, message: str) -> None:
    from envace.common.config import ConfigError

    raw = copy.deepcopy(cfg)
    raw.pop("released", None)
    raw["tts"] = {k: v for k, v in raw["tts"].items() if k not in ("settings", "released_settings")}
    raw["released"] = released
    with pytest.raises(ConfigError, match=message):
        complete_config(raw)


def test_released_checkpoints_are_evaluated_where_ours_are(released_cfg: dict) -> None:
    from envace.common.config import evaluation_pairs

    pairs = evaluation_pairs(released_cfg)
    ours = sorted(b for m, b in pairs if m == "envace_8b")
    assert sorted(b for m, b in pairs if m == RELEASED) == ours and ours


def test_table1_has_the_released_row_after_ours(released_cfg: dict, released_results: Path) -> None:
    from envace.report.tables import build_table1

    rows = build_table1(ReportContext(released_cfg, released_results, resamples=200)).rows
    labels = [r.label for r in rows]
    i = labels.index("EnvACE-8B")
    released = rows[i + 1]
    assert released.label == "EnvACE-8B (released weights)" and released.paper == rows[i].paper
    assert released.cells["tau2"].interval.point == pytest.approx(100.0)
    # in the released-weights view our row already reads the release: no second row
    from envace.report.context import ReleasedView

    view = ReportContext(released_cfg, released_results, resamples=200, view=ReleasedView.of(released_cfg))
    assert "EnvACE-8B (released weights)" not in [r.label for r in build_table1(view).rows]


def test_report_page_shows_the_released_section(released_cfg: dict, released_results: Path) -> None:
    from envace.report.html import released

    section = build_diff(ReportContext(released_cfg, released_results, resamples=200))["released"]
    page = released(section)
    assert "envace_8b &rarr; envace_8b_released" in page and "EnvACE-8B" in page
    assert page.count("<table") == 2 and "Claims with the released weights" in page
