"""GPU check: one training step of every workflow x policy on a random-init Qwen3 of the real
architecture, at the paper's lengths and PPO token budgets, with the dry run's memory
prediction beside each measurement.

    make gpu-check                                  # on a GPU machine: 1.7B and 4B, engine=hf
    .venv/bin/python bench/gpu.py --device cpu --scales 0.6b --response-tokens 24 \
        --token-budget 512 --rollout-tokens 8       # the CPU form the test suite runs

Each case runs in its own process (a clean peak-memory counter; one OOM loses one case)
and composes its config from conf/ exactly as `gridrun plan` would (scale=<s> task=math
model.init=random engine=hf), on the task's fixture in tests/fixtures/ (--task).

Rollouts of a random model never stop early: every response runs to its limit. HF
`generate` at 5,120 tokens takes minutes per stage, so `--rollout-tokens N` caps what is
sampled and then extends each completion with random tokens to the cell's response length
before the update: the update (and its memory) is then the paper's, the rollout's time is
that of N tokens. The JSON says which was done (`rollout_tokens`).

Printed per case: s/step, rollout s, update s, peak memory per GPU of the rollout and of the
update (torch.cuda.max_memory_allocated; peak RSS on CPU, both phases together), sequences
and micro-batches of the update, and the memory model's prediction (gridrun/memory.py).
Only one GPU is used: data-parallel ranks each hold a full replica, so per-GPU memory is the
same on two; the step time on two is what the dry run's cost model assumes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = {"math": REPO / "tests" / "fixtures" / "dapo_math_sample.parquet",
            "code": REPO / "tests" / "fixtures" / "deepcoder_sample.jsonl"}
WORKFLOWS = ("single", "eval_opt", "voting", "orch_workers")
POLICIES = ("shared", "isolated")


def overrides(args: argparse.Namespace, scale: str, workflow: str, policy: str, data_root: str) -> list[str]:
    out = [
        f"scale={scale}", f"workflow={workflow}", f"task={args.task}", f"policy={policy}", "engine=hf",
        "model.init=random", f"grid.data_root={data_root}", "logging.wandb_mode=disabled",
        f"train.batch_problems={args.problems}", f"train.ppo_mini_batch={args.problems}", f"grpo.n={args.n}",
        # Always 3 workers: a memory check wants a step's most sequences, and a random model's
        # plan parses to any count under the released protocol's one worker per strategy.
        "protocol.orch_workers=fixed",
    ]
    if args.gpu:
        out.append(f"gpu={args.gpu}")
    if args.response_tokens:
        out.append(f"lengths.max_response_tokens={args.response_tokens}")
    if args.token_budget:
        out.append(f"train.micro_token_budget={args.token_budget}")
    if args.device == "cpu":
        out.append("model.dtype=float32")
    return out


def compose(args: argparse.Namespace, scale: str, workflow: str, policy: str, data_root: str):
    from gridrun.grid.compose import Composer
    from gridrun.grid.plan import run_config

    tree = Composer().compose(overrides(args, scale, workflow, policy, data_root))
    kind = "sa_rl" if workflow == "single" else "train"
    return run_config(tree, {"id": f"gpu-check-{workflow}-{policy}-{scale}", "kind": kind, "seed": 0}), tree["grid"]["gpu"]


def run_case(args: argparse.Namespace) -> dict:
    """One training step of one case, in this process."""
    import torch

    from gridrun.cellrun import model_files
    from gridrun.memory import predict
    from gridrun.seam import cellstate
    from gridrun.seam.runconfig import dump_config
    from gridrun.seam.rundir import RunDir
    from gridrun.train.trainer import Trainer

    config, gpu = compose(args, args.scale, args.workflow, args.policy, args.data_root)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    run_dir = RunDir(Path(args.tmp) / config.cell.id)
    run_dir.root.mkdir(parents=True)
    run_dir.config_yaml.write_text(dump_config(config))
    # As `gridrun run` does: the cell runs, so the trainer may record its progress.
    run_dir.record(cellstate.started(os.getpid(), "gpu-check", config.steps_to_train))
    started = time.time()
    trainer = Trainer(config, run_dir, model_files(config.model))
    load_s = time.time() - started
    peaks: dict[str, float] = {}
    response_tokens = config.lengths.max_response_tokens
    sampled = min(args.rollout_tokens or response_tokens, response_tokens)
    rng = random.Random(0)
    ordinary = [i for i in range(len(trainer.tokenizer)) if i not in trainer.tokenizer.all_special_ids]
    rollout = trainer.rollout

    def capped_rollout(problems, samples, temperature):
        config.lengths.max_response_tokens = sampled
        try:
            episodes = rollout(problems, samples, temperature)
        finally:
            config.lengths.max_response_tokens = response_tokens
        for episode in episodes:
            for turn in episode.turns:
                missing = response_tokens - len(turn.completion_ids)
                turn.completion_ids = turn.completion_ids + [rng.choice(ordinary) for _ in range(missing)]
                turn.logprobs = turn.logprobs + [-12.0] * missing
                turn.finish_reason = "length"
        return episodes

    sleep = trainer.engine.sleep

    def mark_rollout_end() -> None:
        if cuda:
            torch.cuda.synchronize()
            peaks["rollout"] = torch.cuda.max_memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()
        sleep()

    import gridrun.train.update as update_module

    packer = update_module.micro_batches
    largest = {"tokens": 0, "count": 0}

    def recording_micro_batches(seqs, token_budget, packed=False):
        for chunk in packer(seqs, token_budget, packed):
            if packed:
                from gridrun.train.cpu.packed import packed_rows

                tokens = len(packed_rows([s.prompt_ids for s in chunk], [s.completion_ids for s in chunk])[0])
            else:
                tokens = len(chunk) * max(len(s.prompt_ids) + len(s.completion_ids) for s in chunk)
            largest["tokens"] = max(largest["tokens"], tokens)
            largest["count"] += 1
            yield chunk

    update_module.micro_batches = recording_micro_batches
    trainer.rollout = capped_rollout
    trainer.engine.sleep = mark_rollout_end
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    row = trainer.train_step(1)
    if cuda:
        torch.cuda.synchronize()
        peaks["update"] = torch.cuda.max_memory_allocated() / 2**30
    else:
        peaks["process_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    predicted = predict(config, gpu["memory_gib"])
    at_largest = predict(config, gpu["memory_gib"], micro_tokens=largest["tokens"] or None)
    seqs = sum(v for k, v in row.items() if k.startswith("role/") and k.endswith("/seqs"))
    return {
        "scale": args.scale, "workflow": args.workflow, "policy": args.policy, "device": str(device),
        "gpu_class": gpu["name"], "problems": args.problems, "n": args.n,
        "response_tokens": response_tokens, "rollout_tokens": sampled,
        "token_budget": config.train.micro_token_budget, "seqs": seqs,
        "micro_batches": largest["count"], "largest_micro_tokens": largest["tokens"],
        "load_s": round(load_s, 1), "step_s": round(row["time/step_s"], 2),
        "rollout_s": round(row["time/rollout_s"], 2), "update_s": round(row["time/update_s"], 2),
        # The update's row tokens: gridrun/grid/cost.py fits the update's rate to these.
        "update_tokens": int(row["time/update_tokens"]),
        "peak_gb": {k: round(v, 2) for k, v in peaks.items()},
        "predicted_gb": {k: round(v, 2) for k, v in predicted.as_gib().items()},
        # The trainer's own allocations: what torch.cuda.max_memory_allocated measures (no
        # engine, no CUDA context).
        "predicted_update_gb_at_largest_micro": round(at_largest.as_gib()["trainer_update"], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--scales", default="1.7b,4b")
    parser.add_argument("--workflows", default=",".join(WORKFLOWS))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--task", default="math", choices=("math", "code"), help="data: the task's test fixture")
    parser.add_argument("--gpu", default=None, help="GPU class (default: each scale's)")
    parser.add_argument("--problems", type=int, default=1, help="problems per step (default 1)")
    parser.add_argument("--n", type=int, default=4, help="rollouts per problem (default 4)")
    parser.add_argument("--rollout-tokens", type=int, default=None,
                        help="tokens actually sampled per call; completions are then extended to the response length")
    parser.add_argument("--response-tokens", type=int, default=None, help="override the paper's response length")
    parser.add_argument("--token-budget", type=int, default=None, help="override the paper's micro-batch token budget")
    parser.add_argument("--json", action="store_true", help="one JSON line per case")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per case")
    # Internal: run one case in this process.
    parser.add_argument("--one", nargs=3, metavar=("SCALE", "WORKFLOW", "POLICY"), help=argparse.SUPPRESS)
    parser.add_argument("--data-root", help=argparse.SUPPRESS)
    parser.add_argument("--tmp", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        args.scale, args.workflow, args.policy = args.one
        print("RESULT " + json.dumps(run_case(args)), flush=True)
        return
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        from gridrun.tasks.data import prepare

        # The fixtures are small: hold out 3 problems (the paper's splits hold out 1412 / 1000).
        prepare(args.task, FIXTURES[args.task], Path(tmp) / "data" / args.task, val_size=3)
        passthrough = [a for a in sys.argv[1:] if a != "--json"]
        for scale in args.scales.split(","):
            for workflow in args.workflows.split(","):
                for policy in args.policies.split(","):
                    if workflow == "single" and policy == "isolated":
                        continue  # one role: SP and IP are the same cell
                    case = [sys.executable, __file__, *passthrough, "--one", scale, workflow, policy,
                            "--data-root", str(Path(tmp) / "data"), "--tmp", tmp]
                    results.append(_one(case, scale, workflow, policy, args.timeout))
                    print(json.dumps(results[-1]) if args.json else _line(results[-1]), flush=True)
    if not args.json:
        print(f"{len([r for r in results if 'error' not in r])}/{len(results)} cases ran")


def _one(case: list[str], scale: str, workflow: str, policy: str, timeout: float) -> dict:
    try:
        # A failed case is reported, not raised: its stderr's last line says why.
        done = subprocess.run(case, check=False, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    except subprocess.TimeoutExpired:
        return {"scale": scale, "workflow": workflow, "policy": policy, "error": f"timed out after {timeout:.0f} s"}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    oom = "out of memory" in done.stderr.lower()
    return {"scale": scale, "workflow": workflow, "policy": policy, "error": ("OOM: " if oom else "") + tail[-300:]}


def _line(r: dict) -> str:
    head = f"{r['scale']:>5s} {r['workflow']:>12s} {r['policy']:>8s}"
    if "error" in r:
        return f"{head}  FAILED {r['error']}"
    return (f"{head}  step {r['step_s']:7.2f}s  rollout {r['rollout_s']:7.2f}s  update {r['update_s']:7.2f}s  "
            f"peak {r['peak_gb']}  predicted {r['predicted_gb']}")


if __name__ == "__main__":
    main()
