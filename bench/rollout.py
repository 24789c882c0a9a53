"""Stage-batched rollouts vs running each episode's calls one by one, on toy Voting, and
against the physical limit: one plain batched `generate`.

    .venv/bin/python bench/rollout.py --json

Both sides run the same episodes (16 problems x 4 samples, 3 voters + aggregator, IP
adapters attached) on the same model in one process; the speed-up is their ratio.

`efficiency` is the stage-batched rollout's generated tokens per second divided by those
of plain batched transformers `generate` calls on a copy of the model without adapters,
workflow or log-prob recording, one call per stage over the very prompts the rollout
sent (the voters' 192, then the aggregators' 64: the aggregator reads the voters'
answers, so no rollout can make it one call), same sampling and token limit: what the
rollout keeps of what the hardware gives. `cpu_efficiency` is the same with process CPU
seconds, the steadier number on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch
from transformers import GenerationConfig

from gridrun.cellrun import model_files
from gridrun.seam.runconfig import CellSpec, LoraSpec, PolicySpec, RunConfig
from gridrun.tasks.arith import ArithTask
from gridrun.train.engines.hf import HFEngine, stop_token_ids
from gridrun.train.episode import Episode
from gridrun.train.model import load_base
from gridrun.train.policy import attach_adapters, routing_for
from gridrun.train.rollout import ChatEncoder, SamplingParams, StageBatcher
from gridrun.workflows.voting import VotingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--problems", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)

    config = RunConfig(
        cell=CellSpec(id="bench", kind="train"),
        workflow=VotingParams(),
        policy=PolicySpec(name="isolated"),
        lora=LoraSpec(rank=8, alpha=16),
    )
    workflow, task = config.workflow_entry(), ArithTask(n_val=400)  # the split its recorded timings used
    base, tokenizer = load_base(config.model, model_files(config.model))
    routing = routing_for(config, workflow)
    model = attach_adapters(base, config, routing)
    engine = HFEngine(model, tokenizer)
    encoder = ChatEncoder(tokenizer, enable_thinking=False, max_prompt_tokens=256)
    sampling = SamplingParams(temperature=0.7, max_new_tokens=48)
    problems = task.train_problems()[: args.problems]

    async def program(llm, episode):
        await workflow.run(llm, episode, task, config.workflow, config.protocol)

    def timed(sequential: bool) -> tuple[float, float, int, list[Episode]]:
        episodes = [Episode(problem=p, sample=k) for p in problems for k in range(args.samples)]
        batcher = StageBatcher(engine, encoder, routing.adapter, sampling)
        torch.manual_seed(0)
        wall, cpu = time.perf_counter(), time.process_time()
        batcher.run(episodes, program, sequential=sequential)
        return time.perf_counter() - wall, time.process_time() - cpu, len(batcher.batches), episodes

    plain, _ = load_base(config.model, model_files(config.model))
    timed(False)  # warm-up: first-call overheads out of the comparison
    batched_s, batched_cpu_s, batched_calls, episodes = timed(False)
    stages = [[t.prompt_ids for e in episodes for t in e.turns if t.role == role] for role in workflow.roles]
    batched_tokens = sum(len(turn.completion_ids) for e in episodes for turn in e.turns)
    plain_generate(plain, tokenizer, stages[0][:8], sampling)  # warm-up
    plain_s, plain_cpu_s, plain_tokens = (sum(v) for v in zip(*(plain_generate(plain, tokenizer, stage, sampling)
                                                                   for stage in stages)))
    sequential_s, _, sequential_calls, _ = timed(True)
    result = {
        "workflow": "voting",
        "episodes": args.problems * args.samples,
        "batched_s": round(batched_s, 3),
        "batched_engine_calls": batched_calls,
        "sequential_s": round(sequential_s, 3),
        "sequential_engine_calls": sequential_calls,
        "speedup": round(sequential_s / batched_s, 2),
        "sequences": sum(len(stage) for stage in stages),
        "batched_tokens": batched_tokens,
        "plain_generate_s": round(plain_s, 3),
        "plain_generate_tokens": plain_tokens,
        "efficiency": round((batched_tokens / batched_s) / (plain_tokens / plain_s), 3),
        "cpu_efficiency": round((batched_tokens / batched_cpu_s) / (plain_tokens / plain_cpu_s), 3),
    }
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))


def plain_generate(model: Any, tokenizer: Any, prompts: list[list[int]], sampling: SamplingParams) -> tuple[float, float, int]:
    """(wall s, CPU s, generated tokens up to each row's first stop token) of one
    left-padded `generate` call over `prompts`."""
    stops = stop_token_ids(tokenizer)
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), tokenizer.pad_token_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        attention[row, width - len(ids) :] = 1
    config = GenerationConfig(max_new_tokens=sampling.max_new_tokens, do_sample=True, temperature=sampling.temperature,
                              top_k=0, top_p=sampling.top_p, eos_token_id=stops, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    wall, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        generated = model.generate(input_ids=input_ids, attention_mask=attention, generation_config=config)[:, width:]
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    hits = torch.isin(generated, torch.tensor(stops))
    # Tokens up to and including the first stop; rows that never stop count in full.
    lengths = torch.where(hits.any(1), hits.float().argmax(1) + 1, torch.full_like(hits[:, 0], generated.shape[1], dtype=torch.long))
    return wall, cpu, int(lengths.sum())


if __name__ == "__main__":
    main()
