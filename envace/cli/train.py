"""``envace train``: train one run of ``training.runs`` with verl 0.9.1's ``main_ppo``, at every scale.

Hands over to :func:`envace.train.verl_ext.launch.launch`: the same ``python -m verl.trainer.main_ppo``
command (our Hydra run file, agent loop, role-wise estimator, trainer mode, reward function, checkpoint
and resume settings) on the cluster and on a CPU; at smoke scale (``gpus_per_node: 0``) only the scale
values and verl's CPU platform (:mod:`envace.train.verl_ext.cpu`) differ. The training parquet is ``--data``
(default ``<paths.data>/cm2_train.parquet``, the output of ``envace data``).

Checkpoints go to ``--checkpoint-dir`` (never a Snakemake output); a re-submitted job resumes from the last
one (verl's ``resume_mode=auto``). The done-file (JSON, written atomically) is written only after the last
step.
"""

from __future__ import annotations

import argparse

from envace.common.config import DEFAULT_CONFIG, load_config


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="train one run of training.runs (verl main_ppo; CPU platform at "
                                            "smoke scale)")
    p.add_argument("--config", default=DEFAULT_CONFIG,
                   help="resolved config (YAML/JSON) (default: %(default)s)")
    p.add_argument("--run", required=True, help="run id in training.runs")
    p.add_argument("--checkpoint-dir", required=True, help="checkpoints (outside Snakemake's outputs)")
    p.add_argument("--done", required=True, help="done-file written atomically at the end")
    p.add_argument("--data", help="training parquet (default: <paths.data>/cm2_train.parquet)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    runs = cfg["training"]["runs"]
    if args.run not in runs:
        raise ValueError(f"unknown run {args.run!r}; training.runs has {sorted(runs)}")
    from envace.train.verl_ext.launch import launch

    return int(launch(cfg, args.run, args.checkpoint_dir, args.done, data=args.data))
