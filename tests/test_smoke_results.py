"""The shipped smoke results (what `make smoke` reports on) belong to the current config/smoke.yaml:
every evaluation and TTS run of the smoke matrix is present, complete, and carries the config's hash.
If this fails after editing config/smoke.yaml, run `python tests/data/make_example_results.py --smoke`."""

from envace.config import checkpoint_model_id, eval_hash, load_config, tts_hash
from envace.results import eval_path, read_results, tts_path


def test_smoke_results_match_smoke_config(repo_root):
    cfg = load_config(repo_root / "config/smoke.yaml")
    root = repo_root / "tests/data/smoke_results"
    pairs = {
        (m, b)
        for t in ("table1", "table2")
        for m in cfg["evaluation"][t]["models"]
        for b in cfg["evaluation"][t]["benchmarks"]
    }
    ckpt = cfg["evaluation"]["checkpoints"]
    pairs |= {(checkpoint_model_id(ckpt["run"], s), ckpt["benchmark"]) for s in ckpt["steps"]}
    n = 0
    for model, bench in sorted(pairs):
        for seed in cfg["seeds"]:
            res = read_results(
                eval_path(root, model, bench, seed), expected_hash=eval_hash(cfg, model, bench)
            )
            assert res.manifest["scale"] == "smoke" and res.lines
            n += 1
    for setting in cfg["tts"]["settings"]:
        for bench in cfg["tts"]["benchmarks"]:
            for seed in cfg["tts"]["seeds"]:
                read_results(
                    tts_path(root, setting, bench, seed), expected_hash=tts_hash(cfg, setting, bench)
                )
                n += 1
    assert n == len(pairs) * len(cfg["seeds"]) + len(cfg["tts"]["settings"]) * len(cfg["tts"]["benchmarks"])
