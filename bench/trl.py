"""gridrun's single-agent GRPO step against TRL's GRPOTrainer, alternating in one process.

    .venv/bin/python bench/trl.py --json        # needs the bench extra: pip install -e '.[bench]'

Matched settings on both sides: the toy world's model and tokenizer, the same chat-templated
prompts (checked token for token), LoRA r16 / alpha 32 on all linear layers, 8 problems x 8
rollouts per step, at most 48 new tokens, temperature 0.7 with no top-k, the arith reward,
one optimizer step per batch (gridrun: one mini-batch of 64; TRL: 64 completions per
device batch, no gradient accumulation, one iteration), a constant learning rate, no KL,
PPO clip 0.2 / 0.28 and seq-mean-token-mean aggregation (TRL's loss_type="grpo"), gradient
checkpointing and bf16 off, one thread. gridrun's step is `Trainer.train_step`: rollout,
reward, advantages, update, diagnostics.

TRL drives its own training loop; a callback runs and times one gridrun step just before
each TRL step begins, so the two alternate under the same machine load. A TRL step is
timed from its `on_step_begin` to its `on_step_end` (generation, reward, loss, backward,
optimizer step; its data loading and logging are outside, in its favour). The first pair
pays one-off costs and is dropped; `ratio` is the median over pairs of gridrun / TRL wall
seconds. `cpu_ratio` is the same over the process's CPU seconds (every thread, one
torch thread each side): on a shared machine wall time also counts waiting for a core,
CPU time mostly does not, so it is the steadier of the two under load.
Generated tokens per step are reported for both sides (mean over the timed pairs): the
two policies start from the same weights and learn at the same rate, so a ratio is only
meaningful while these stay close.

Left out: vLLM (TRL's and gridrun's), several processes, and the multi-agent workflows
(TRL has none).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# `python bench/trl.py` puts bench/ first on sys.path, where this file would shadow the
# `trl` package it measures.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import torch

from gridrun.cellrun import model_files
from gridrun.seam.runconfig import config_from_dict, dump_config
from gridrun.seam.rundir import RunDir
from gridrun.tasks.arith import ArithTask
from gridrun.tasks.base import Problem
from gridrun.train.model import load_base
from gridrun.train.rollout import ChatEncoder
from gridrun.train.trainer import Trainer

PROBLEMS, ROLLOUTS, NEW_TOKENS, TEMPERATURE, LR = 8, 8, 48, 0.7, 5e-4
LORA_RANK, LORA_ALPHA = 16, 32
# The arith split the recorded timings used (the task's default validation split is now 200).
N_VAL = 400


def gridrun_config(steps: int) -> dict[str, Any]:
    """The sa_rl cell both sides are matched to (validation and checkpoints never reached)."""
    return {
        "cell": {"id": "sa_rl-bench", "kind": "sa_rl", "seed": 0},
        "model": {"name_or_path": "toy", "toy": {}},
        "workflow": {"name": "single"},
        "task": {"name": "arith", "n_val": N_VAL},
        "lengths": {"max_prompt_tokens": 256, "max_response_tokens": NEW_TOKENS},
        "policy": {"name": "shared"},
        "lora": {"rank": LORA_RANK, "alpha": LORA_ALPHA},
        "engine": {"name": "hf"},
        "sampling": {"temperature": TEMPERATURE},
        "grpo": {"n": ROLLOUTS},
        "optim": {"lr": LR, "warmup_steps": 0, "schedule": "constant", "weight_decay": 0.0},
        "train": {"total_steps": steps, "batch_problems": PROBLEMS, "ppo_mini_batch": PROBLEMS,
                  "val_every": 10_000, "save_every": 10_000, "gradient_checkpointing": False},
        "logging": {"wandb_mode": "disabled"},
    }


def trl_trainer(steps: int, out_dir: Path, task: ArithTask, tokens: list[int]) -> Any:
    """TRL's GRPOTrainer on the same model, prompts and reward; appends each step's
    generated-token count to `tokens`."""
    try:
        from datasets import Dataset
        from peft import LoraConfig
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as err:
        raise SystemExit(f"bench/trl.py needs TRL ({err}): pip install -e '.[bench]'") from None

    spec = config_from_dict(gridrun_config(steps)).model
    model, tokenizer = load_base(spec, model_files(spec))
    model.requires_grad_(True)  # load_base freezes the base; peft freezes it again around LoRA
    by_id = {p.id: p for p in task.train_problems()}
    rows = [{"prompt": task.prompts.generator(p.question), "problem_id": p.id} for p in task.train_problems()]

    def arith_reward(completions: list[Any], completion_ids: list[list[int]], problem_id: list[str],
                     **_: Any) -> list[float]:
        tokens.append(sum(len(ids) for ids in completion_ids))
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        problems: list[Problem] = [by_id[i] for i in problem_id]
        return [score.reward for score in task.score_many(list(zip(texts, problems)))]

    args = GRPOConfig(
        output_dir=str(out_dir),
        use_cpu=True,
        max_steps=steps,
        per_device_train_batch_size=PROBLEMS * ROLLOUTS,
        gradient_accumulation_steps=1,
        num_generations=ROLLOUTS,
        num_iterations=1,
        max_completion_length=NEW_TOKENS,
        temperature=TEMPERATURE,
        top_k=0,
        top_p=1.0,
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="grpo",
        chat_template_kwargs={"enable_thinking": False},
        gradient_checkpointing=False,
        bf16=False,
        report_to="none",
        logging_steps=10_000,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    peft = LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules="all-linear",
                      bias="none", task_type="CAUSAL_LM")
    return GRPOTrainer(model=model, reward_funcs=[arith_reward], args=args, train_dataset=Dataset.from_list(rows),
                       processing_class=tokenizer, peft_config=peft)


def check_same_prompts(trainer: Any, encoder: ChatEncoder, task: ArithTask) -> None:
    """Both sides must feed the model the same prompt tokens."""
    messages = [task.prompts.generator(p.question) for p in task.train_problems()[:4]]
    ours = encoder.encode(messages)
    theirs = [
        trainer.processing_class.apply_chat_template(m, add_generation_prompt=True, tokenize=True,
                                                      return_dict=False, **trainer.chat_template_kwargs)
        for m in messages
    ]
    theirs = [list(t["input_ids"]) if isinstance(t, dict) else list(t) for t in theirs]
    if ours != theirs:
        raise SystemExit(f"prompt tokens differ: gridrun {ours[0]} vs TRL {theirs[0]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--pairs", type=int, default=8, help="timed gridrun/TRL step pairs (one more is a warm-up)")
    parser.add_argument("--unmerged-rollout", action="store_true",
                        help="gridrun's rollout through peft's unmerged LoRA layers, as before the merged rollout")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import TrainerCallback

    steps = args.pairs + 1
    with tempfile.TemporaryDirectory() as tmp:
        cell = Path(tmp) / "gridrun"
        cell.mkdir()
        config = config_from_dict(gridrun_config(steps))
        run_dir = RunDir(cell)
        run_dir.config_yaml.write_text(dump_config(config))  # a planned cell's: its writers check for it
        ours = Trainer(config, run_dir, model_files(config.model))
        if args.unmerged_rollout:
            ours.engine.merge_lora = False  # type: ignore[attr-defined]
        trl_tokens: list[int] = []
        theirs = trl_trainer(steps, Path(tmp) / "trl", ArithTask(n_val=N_VAL), trl_tokens)
        check_same_prompts(theirs, ours.encoder, ArithTask(n_val=N_VAL))
        # (wall s, CPU s) per step of each side.
        gridrun_s: list[tuple[float, float]] = []
        gridrun_tokens: list[int] = []
        trl_s: list[tuple[float, float]] = []

        class Alternate(TrainerCallback):
            started = (0.0, 0.0)

            def on_step_begin(self, *_: Any, **__: Any) -> None:
                wall, cpu = time.perf_counter(), time.process_time()
                row = ours.train_step(len(gridrun_s) + 1)
                gridrun_s.append((time.perf_counter() - wall, time.process_time() - cpu))
                gridrun_tokens.append(int(row["role/generator/tokens"]))
                self.started = (time.perf_counter(), time.process_time())

            def on_step_end(self, *_: Any, **__: Any) -> None:
                trl_s.append((time.perf_counter() - self.started[0], time.process_time() - self.started[1]))

        theirs.add_callback(Alternate())
        with contextlib.redirect_stdout(sys.stderr):  # TRL prints its run summary
            theirs.train()
    if len(trl_s) != steps or len(trl_tokens) != steps:
        raise SystemExit(f"TRL ran {len(trl_s)} steps and scored {len(trl_tokens)} batches, expected {steps}")
    pairs = list(zip(gridrun_s, trl_s))[1:]

    def median(values: Any) -> float:
        return round(statistics.median(values), 3)

    result = {
        "gridrun_s": median(g[0] for g, _ in pairs),
        "trl_s": median(t[0] for _, t in pairs),
        "ratio": median(g[0] / t[0] for g, t in pairs),
        "gridrun_cpu_s": median(g[1] for g, _ in pairs),
        "trl_cpu_s": median(t[1] for _, t in pairs),
        "cpu_ratio": median(g[1] / t[1] for g, t in pairs),
        "tokens_per_step": [round(statistics.mean(gridrun_tokens[1:]), 1), round(statistics.mean(trl_tokens[1:]), 1)],
        "pairs": len(pairs),
        "gridrun_rollout": "unmerged" if args.unmerged_rollout else "merged",
        "trl_version": __import__("trl").__version__,
    }
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
