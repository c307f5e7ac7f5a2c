"""Can the tiny smoke model learn the ledger by SFT on CPU, and how fast? (measurement).

Warm-starts the tiny model (``envace.serve.tiny_model``, in-process) with ``envace.train.warmstart.sft`` in
mini-batches on the reference records of the ledger's train split, and at the given steps evaluates
the held-out test split in the real ledger (``envace.train.heldout.task_success``) at two temperatures.
Prints one Markdown row per evaluation: step, CPU seconds of SFT so far, the last step's loss, success,
the state check on transfer tasks (the right transfer was made) and the answer check; with ``--fidelity``
also the test-time rehearsal of the test tasks' reference calls (exact match per task kind, field F1).
``--show-balances`` words the questions with the balances stated (``benchmarks.ledger.show_balances``).

This is what decides the smoke model and warm-start size of the learning test: the test needs a warm
start whose held-out success is clearly above 0 and below 1 at the rollout temperature.

Usage:
    .venv/bin/python benchmarks/ledger_learnability.py --steps 2000 --eval-at 500,1000,1500,2000
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from envace.bench.ledger import LedgerAdapter, generate_tasks, reference_record
from envace.serve.tiny_model import tiny_model_and_tokenizer
from envace.train.data import normalize_record
from envace.train.heldout import reference_fidelity, task_success
from envace.train.warmstart import sft, sft_sequences


def held_out(model: torch.nn.Module, tokenizer, adapter: LedgerAdapter, temperature: float,
             samples: int, seed: int, template: str) -> dict[str, float]:
    """Success, transfer-state and answer rates on the test split (``samples`` per task;
    :func:`envace.train.heldout.task_success`). ``template``: ``default`` renders the chats with the
    template's default, ``training`` as verl's rollouts do (``enable_thinking=False``)."""
    lines = task_success(model, tokenizer, adapter, samples=samples, temperature=temperature, seed=seed,
                         enable_thinking=template == "default")
    kind = {t.task_id: t.meta["ledger_task"].kind for t in adapter.load_tasks(["test"], None)}
    transfers = [x for x in lines if kind[x["task_id"]] == "transfer"]
    return {"success": sum(x["score"] for x in lines) / len(lines),
            "transfer_state": sum(x["subscores"]["state"] for x in transfers) / max(1, len(transfers)),
            "answer": sum(x["subscores"]["answer"] for x in lines) / len(lines)}


def fidelity(model: torch.nn.Module, tokenizer, tasks: list, template: str,
             prompt: str = "rehearsal_v2") -> str:
    """``"exact balance / exact transfer / field F1"`` of test-time rehearsals of the tasks' reference
    calls (:func:`envace.train.heldout.reference_fidelity`, no reference responses shown)."""
    kind = {t.task_id: t.kind for t in tasks}
    pairs = reference_fidelity(model, tokenizer, [reference_record(t) for t in tasks], prompt=prompt,
                               enable_thinking=template == "default")

    def exact(k: str) -> float:
        hits = [p.exact for p in pairs if kind[p.task_id] == k]
        return sum(hits) / max(1, len(hits))

    f1 = sum(p.field_f1 for p in pairs) / len(pairs)
    return f"{exact('balance'):.3f} / {exact('transfer'):.3f} / {f1:.3f}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000, help="SFT steps")
    ap.add_argument("--eval-at", default="250,500,750,1000", help="comma-separated steps to evaluate at")
    ap.add_argument("--lr", type=float, default=1e-2, help="AdamW learning rate")
    ap.add_argument("--batch-rows", type=int, default=16, help="rows per SFT step")
    ap.add_argument("--n-train", type=int, default=512, help="ledger train tasks")
    ap.add_argument("--behaviours", default="act,answer",
                    help="warm-start behaviours (envace.train.warmstart)")
    ap.add_argument("--template-variants", choices=["plain", "both"], default="both",
                    help="chat-template variants of each row: plain ({}), or both ({} and "
                         "enable_thinking=False, the warm start's default: evaluation renders the first, "
                         "verl's rollout the second)")
    ap.add_argument("--samples", type=int, default=4, help="samples per held-out task")
    ap.add_argument("--temperatures", default="1.0,0.6", help="comma-separated evaluation temperatures")
    ap.add_argument("--eval-templates", default="default",
                    help="comma-separated renderings to evaluate: default (the template's default) and/or "
                         "training (enable_thinking=False, as verl's rollouts render)")
    ap.add_argument("--seed", type=int, default=0, help="model, data order and sampling seed")
    ap.add_argument("--show-balances", action="store_true",
                    help="ledger questions state the balances (benchmarks.ledger.show_balances)")
    ap.add_argument("--fidelity", action="store_true",
                    help="also report test-time rehearsal fidelity at each evaluation (REHEARSE prompt "
                         "without reference responses, greedy, on the test tasks' reference calls): exact "
                         "match of balance calls / of transfer calls, and mean field F1")
    ap.add_argument("--hidden-references", type=float, default=0.0,
                    help="share of the examples whose REHEARSE rows show no reference responses "
                         "(tiny_model.warmstart[i].hidden_references)")
    ap.add_argument("--rehearsal-prompt", default="rehearsal_v2",
                    help="REHEARSE prompt of the rehearse rows and of --fidelity "
                         "(rehearsal_v2, rehearsal_compact)")
    ap.add_argument("--init", help="start from this saved model and tokenizer (default: a fresh tiny model)")
    ap.add_argument("--save", help="save the warm-started model and tokenizer here at the end")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    ledger = {"seed": 0, "n_train": args.n_train, "n_test": 32, "show_balances": args.show_balances}
    adapter = LedgerAdapter({"ledger": ledger})
    tasks = generate_tasks(**ledger)
    examples = [normalize_record(reference_record(t), i) for i, t in enumerate(tasks["train"])]
    if args.init:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(args.init)
        tokenizer = AutoTokenizer.from_pretrained(args.init)
    else:
        model, tokenizer = tiny_model_and_tokenizer(args.seed)
    rows = sft_sequences(examples, tokenizer, behaviours=args.behaviours.split(","),
                         rehearsal_prompt=args.rehearsal_prompt, hidden_references=args.hidden_references,
                         **({"template_variants": ({},)} if args.template_variants == "plain" else {}))
    print(f"{len(rows)} rows, mean length {sum(len(r[0]) for r in rows) / len(rows):.0f} tokens\n")
    cols = "success / transfer state / answer"
    points = [(float(t), r) for r in args.eval_templates.split(",") for t in args.temperatures.split(",")]
    head = " | ".join(f"{r} T={t} {cols}" for t, r in points)
    templates = args.eval_templates.split(",") if args.fidelity else []
    head += "".join(f" | {r} rehearsal exact balance / exact transfer / field F1" for r in templates)
    print(f"| step | SFT s | loss | {head} |\n|---|---|---|" + "---|" * (len(points) + len(templates)))
    eval_at = {int(x) for x in args.eval_at.split(",")}
    spent = [0.0, time.process_time()]  # SFT CPU seconds so far, start of the current stretch

    def report(step: int, loss: float) -> None:
        if step % 100 == 0:
            cpu = spent[0] + time.process_time() - spent[1]
            print(f"[step {step}] loss {loss:.3f}, {cpu:.0f} CPU s of SFT", file=sys.stderr, flush=True)
        if step not in eval_at:
            return
        spent[0] += time.process_time() - spent[1]
        cells = []
        for temperature, template in points:
            r = held_out(model, tokenizer, adapter, temperature, args.samples, args.seed, template)
            cells.append(f"{r['success']:.3f} / {r['transfer_state']:.3f} / {r['answer']:.3f}")
        cells += [fidelity(model, tokenizer, tasks["test"], template, args.rehearsal_prompt)
                  for template in templates]
        print(f"| {step} | {spent[0]:.0f} | {loss:.3f} | {' | '.join(cells)} |", flush=True)
        spent[1] = time.process_time()

    sft(model, rows, args.steps, args.lr, tokenizer.pad_token_id, batch_rows=args.batch_rows, seed=args.seed,
        after_step=report)
    if args.save:
        model.save_pretrained(args.save)
        tokenizer.save_pretrained(args.save)

if __name__ == "__main__":
    main()
