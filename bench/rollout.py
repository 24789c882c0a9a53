"""Stage-batched rollouts vs running each episode's calls one by one, on toy Voting.

    .venv/bin/python bench/rollout.py --json

Both sides run the same episodes (16 problems x 4 samples, 3 voters + aggregator, IP
adapters attached) on the same model in one process; the speed-up is their ratio.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from gridrun.runconfig import CellSpec, PolicySpec, RunConfig, WorkflowSpec
from gridrun.tasks.arith import ArithTask
from gridrun.train.engines.hf import HFEngine
from gridrun.train.episode import Episode
from gridrun.train.model import load_base
from gridrun.train.policy import attach_adapters, routing_for
from gridrun.train.rollout import ChatEncoder, SamplingParams, StageBatcher
from gridrun.train.workflows import get_workflow


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--problems", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)

    config = RunConfig(
        cell=CellSpec(id="bench", kind="train"),
        workflow=WorkflowSpec(name="voting"),
        policy=PolicySpec(name="isolated", lora_rank=8, lora_alpha=16),
    )
    workflow, task = get_workflow("voting"), ArithTask()
    base, tokenizer = load_base(config.model)
    routing = routing_for(config, workflow)
    model = attach_adapters(base, config, routing)
    engine = HFEngine(model, tokenizer)
    encoder = ChatEncoder(tokenizer, enable_thinking=False, max_prompt_tokens=256)
    sampling = SamplingParams(temperature=0.7, max_new_tokens=48)
    problems = task.train_problems()[: args.problems]

    async def program(llm, episode):
        await workflow.run(llm, episode, task, config.workflow)

    def timed(sequential: bool) -> tuple[float, int]:
        episodes = [Episode(problem=p, sample=k) for p in problems for k in range(args.samples)]
        batcher = StageBatcher(engine, encoder, routing.adapter, sampling)
        torch.manual_seed(0)
        started = time.perf_counter()
        batcher.run(episodes, program, sequential=sequential)
        return time.perf_counter() - started, len(batcher.batches)

    timed(False)  # warm-up: first-call overheads out of the comparison
    batched_s, batched_calls = timed(False)
    sequential_s, sequential_calls = timed(True)
    result = {
        "workflow": "voting",
        "episodes": args.problems * args.samples,
        "batched_s": round(batched_s, 3),
        "batched_engine_calls": batched_calls,
        "sequential_s": round(sequential_s, 3),
        "sequential_engine_calls": sequential_calls,
        "speedup": round(sequential_s / batched_s, 2),
    }
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
