"""How much does the ledger warm start's held-out success depend on chance? (measurement).

Builds the tiny model with ``config/smoke_ledger.yaml``'s warm-start curriculum (``envace tiny-model``, pinned
numerics: ``envace.train.numerics``) once per ``--seeds`` value, optionally with every stage's learning
rate scaled (``--lr-scale``) or the last stage's steps changed (``--last-steps``), and evaluates each
build on the ledger's 128 held-out test tasks x ``--samples`` in the real environment
(``envace.train.heldout.task_success``, temperature 0.6, chats rendered as the training rollouts render
them), the base of the learning test. A different seed changes the initial weights and the order of the
SFT batches: a larger perturbation than another machine's float rounding, so a recipe whose success
holds across seeds holds across machines. Prints one Markdown row per build and the spread.

Usage:
    .venv/bin/python benchmarks/warmstart_spread.py --out /tmp/spread --seeds 0,1,2 [--lr-scale 0.3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def local_stages(overlay: dict, folder: Path) -> list[dict]:
    """The overlay's warm-start stages reading ``folder``'s ledger records (each stage's and mix item's
    ``data/smoke/ledger_<split>.jsonl`` -> ``folder/ledger_<split>.jsonl``)."""
    def local(part: dict) -> dict:
        data = part["data"] if isinstance(part["data"], list) else [part["data"]]
        out = {**part, "data": [str(folder / Path(d).name) for d in data]}
        return {**out, "mix": [local(m) for m in part["mix"]]} if "mix" in part else out
    return [local(stage) for stage in overlay["tiny_model"]["warmstart"]]


def write_config(out: Path, seed: int, args: argparse.Namespace) -> Path:
    """``config/smoke.yaml`` with the overlay's ledger and its warm-start curriculum on ``out``'s ledger
    records, seed ``seed`` and the ``--lr-scale`` / ``--last-steps`` changes, written as
    ``out/config_seed<seed>.yaml`` (what ``envace tiny-model --config`` reads)."""
    overlay = yaml.safe_load((REPO / "config/smoke_ledger.yaml").read_text())
    cfg = yaml.safe_load((REPO / "config/smoke.yaml").read_text())
    cfg["benchmarks"]["ledger"] = overlay["benchmarks"]["ledger"]
    stages = [{**stage, "lr": stage["lr"] * args.lr_scale} for stage in local_stages(overlay, out)]
    if args.last_steps:
        stages[-1]["steps"] = args.last_steps
    cfg["tiny_model"] = {"seed": seed, "warmstart": stages}
    config = out / f"config_seed{seed}.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return config


def build(out: Path, seed: int, args: argparse.Namespace) -> tuple[Path, float]:
    """One warm start of the overlay's curriculum into ``out/seed<seed>``; returns (folder, seconds)."""
    config = write_config(out, seed, args)
    envace = str(REPO / ".venv/bin/envace")
    for split in ("train", "world"):
        records = out / f"ledger_{split}.jsonl"
        if not records.is_file():
            subprocess.run([envace, "ledger-records", "--config", str(config), "--split", split, "--out",
                            str(records)], check=True, cwd=REPO, capture_output=True)
    folder = out / f"seed{seed}"
    t0 = time.perf_counter()
    with open(out / f"seed{seed}.log", "w") as log:
        subprocess.run([envace, "tiny-model", "--config", str(config), "--out", str(folder)], check=True,
                       cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    return folder, time.perf_counter() - t0


def ledger_spec() -> dict:
    """The overlay's ``benchmarks.ledger.ledger``: the held-out tasks (worded as the overlay words them)."""
    overlay = yaml.safe_load((REPO / "config/smoke_ledger.yaml").read_text())
    return dict(overlay["benchmarks"]["ledger"]["ledger"])


def success(folder: Path, samples: int, ledger: dict) -> float:
    """Mean held-out success of the build on the test split of ``ledger`` (the learning test's base
    measurement)."""
    import torch

    from envace.bench.ledger import LedgerAdapter
    from envace.train.heldout import load_model, task_success

    torch.set_num_threads(2)
    model, tokenizer = load_model(str(folder))
    lines = task_success(model, tokenizer, LedgerAdapter({"ledger": ledger}), samples=samples,
                         temperature=0.6, seed=0, enable_thinking=False)
    return statistics.mean(x["score"] for x in lines)


def parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="working folder")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated tiny_model.seed values")
    ap.add_argument("--lr-scale", type=float, default=1.0, help="multiply every stage's learning rate")
    ap.add_argument("--last-steps", type=int, help="steps of the last stage (default: the overlay's)")
    ap.add_argument("--samples", type=int, default=4, help="samples per held-out task")
    return ap


def main() -> None:
    args = parser().parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    print("| seed | lr scale | last stage steps | build s | final loss | held-out success |")
    print("|---|---|---|---|---|---|")
    for seed in (int(s) for s in args.seeds.split(",")):
        folder, seconds = build(args.out, seed, args)
        done = json.loads((folder / "done.json").read_text())
        rate = success(folder, args.samples, ledger_spec())
        rows.append(rate)
        print(f"| {seed} | {args.lr_scale} | {done['warmstart'][-1]['steps']} | {seconds:.0f} | "
              f"{done['warmstart'][-1]['loss_last']:.3f} | {rate:.3f} |", flush=True)
    spread = f"{min(rows):.3f}-{max(rows):.3f}" if rows else "-"
    print(f"\nheld-out success over {len(rows)} seeds: mean {statistics.mean(rows):.3f}, range {spread}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
