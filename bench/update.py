"""The policy update alone, by phase, packed and padded, beside TRL's GRPO loss and backward on
the same rows, alternating in one process.

    python bench/update.py --json                      # CPU, Qwen3-0.6B shape, random init
    python bench/update.py --model toy --json          # the toy world
    python bench/update.py --device cuda --model Qwen/Qwen3-1.7B --response-tokens 5120 \
        --token-budget 40960 --problems 4 --n 8 --dtype bfloat16 --no-trl --json   # a GPU (bench/gpu.py)

The rows (one step of Voting: per problem and episode, 3 voters of the generator role and one
aggregator; TRL needs the bench extra, `pip install -e '.[bench]'`; `--no-trl` leaves it out):
- a problem's prompt is uniform in [R/8, R/3] tokens (R = --response-tokens; the paper's math
  prompts are a few hundred tokens against R = 5,120), the same for its n episodes' voters;
- a voter's response is log-normal, median 0.4 R, sigma 0.7, clipped to [8, R]: long-tailed,
  mean about R/2 (the paper's ~2,500 of 5,120), about one in eight truncated at R;
- the aggregator's prompt is the problem's plus its episode's three responses (distinct per
  episode, the longest prompts of the step), its response log-normal with median R/25,
  sigma 0.5 (a terse `\\boxed{k}`).
Token ids are drawn uniformly from the vocabulary; rewards and rollout log-probs at random.

gridrun's side is `gridrun.train.update.update` under Shared-Policy (one adapter, every role),
the released preset's GRPO, the mini-batch `problems x n` sequences (4 optimizer steps: the
paper's 4 rows per episode), micro-batches by `--token-budget`: packed (the default path) and
padded (`gridrun.train.cpu.applies` off), each on its own fresh adapter from the same initial weights.
Phases: old log-probs (the pass over every mini-batch but the first), forward (the loss's
log-probs), backward (the rest of each micro-batch: loss and backward), optimizer (AdamW's
step), bookkeeping (the remainder: per-role gradient reads at role boundaries, clipping, the
plan and the metrics).

TRL's side (`GRPOTrainer` 1.x, `loss_type="grpo"`, the same LoRA, temperature and clip range,
no KL; only its loss is used, no generation): what its training loop does with one generation
of these rows and 4 optimizer steps per generation: old log-probs of every row first (TRL
computes them whenever a generation serves several optimizer steps), then per mini-batch
(consecutive rows) micro-batches of a fixed row count, each padded to its longest row: its
`compute_loss`, backward, clipping at 1.0 and AdamW's step. The row count is what fits the
token budget at the step's longest row (a fixed per-device batch must fit the worst case).

Gradient checkpointing is on on both sides where `--checkpointing` (the default at real
scale, as conf/ has it), bf16 off on CPU. `ratio` is the median over repeats of gridrun's
update seconds / TRL's on the same rows; the first repeat is a warm-up and dropped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# `python bench/update.py` puts bench/ first on sys.path, where bench/trl.py would shadow TRL.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import torch

import gridrun.train.update as update_module
from gridrun.seam.routing import Routing
from gridrun.seam.runconfig import GRPOSpec
from gridrun.train import cpu
from gridrun.train.cpu.attention import GROUPED_SDPA
from gridrun.train.cpu.packed import packed_rows
from gridrun.train.policy import activate, adapter_parameters
from gridrun.train.update import TrainSeq, UpdateSettings

SHARED = "shared"
LORA_RANK, LORA_ALPHA = 64, 32  # the paper's (conf/config.yaml lora)
LR, TEMPERATURE, GRAD_CLIP = 2e-5, 0.7, 1.0
# Dense bf16 peaks from the vendors' data sheets (TFLOP/s), for MFU; --peak-tflops overrides.
PEAK_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0, "L40S": 362.1}


def peak_tflops(device: torch.device, dtype: torch.dtype, given: float | None) -> float | None:
    if given or device.type != "cuda" or dtype != torch.bfloat16:
        return given
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)


def draw_rows(problems: int, n: int, response: int, vocab: int, seed: int,
              prompt_tokens: int | None = None) -> list[TrainSeq]:
    """One Voting step's rows (the module docstring says how they are drawn); `prompt_tokens`
    P: each problem's prompt uniform in [P/2, P] instead (long prompts, short responses: the
    code task's shape)."""
    rng = random.Random(seed)

    def tokens(count: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(count)]

    def lognormal(median: float, sigma: float, low: int) -> int:
        return max(low, min(response, round(rng.lognormvariate(math.log(median), sigma))))

    rows = []
    for _ in range(problems):
        low, high = (prompt_tokens // 2, prompt_tokens) if prompt_tokens else (response // 8, response // 3)
        prompt = tokens(rng.randint(low, high))
        for _ in range(n):
            answers = []
            for _ in range(3):
                length = lognormal(0.4 * response, 0.7, 8)
                answers.append(tokens(length))
                rows.append(_row("generator", prompt, answers[-1], rng, length >= response))
            aggregate = prompt + [t for answer in answers for t in tokens(8) + answer]
            rows.append(_row("aggregator", aggregate, tokens(lognormal(response / 25, 0.5, 4)), rng, False))
    return rows


def _row(role: str, prompt: list[int], completion: list[int], rng: random.Random, truncated: bool) -> TrainSeq:
    return TrainSeq(role, SHARED, prompt, completion, [-rng.random() * 2 for _ in completion], rng.gauss(0, 1),
                    truncated)


def base_model(name: str, layers: int | None, dtype: torch.dtype, device: torch.device) -> Any:
    """A random-init Qwen3 of `name`'s published shape (its first `layers` decoder layers), or
    the toy world's model; gridrun's attention on the CPU, as the trainer loads it."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from gridrun.arch import published
    from gridrun.train.cpu.attention import use_grouped_attention

    if name == "toy":
        from gridrun.cellrun import model_files
        from gridrun.seam.runconfig import ModelSpec, ToySpec
        from gridrun.train.model import load_base

        spec = ModelSpec(name_or_path="toy", toy=ToySpec())
        model, _ = load_base(spec, model_files(spec), device)
        model.requires_grad_(True)
        return model.to(dtype)
    shape = {k: v for k, v in published(name).items() if k not in ("architectures", "model_type")}
    if layers:
        shape["num_hidden_layers"] = layers
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM._from_config(Qwen3Config(**shape), dtype=dtype)
    use_grouped_attention(model)  # what load_base does; bench/gpu.py decides on a GPU
    return model


def _lora() -> Any:
    from peft import LoraConfig

    return LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules="all-linear", bias="none",
                      task_type="CAUSAL_LM")


class Phases:
    """Seconds per phase of gridrun's update, read off by wrapping its module functions."""

    def __init__(self, sync: Callable[[], None]) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.tokens: dict[str, int] = defaultdict(int)
        self.sync = sync

    @contextlib.contextmanager
    def timing(self, name: str) -> Iterator[None]:
        self.sync()
        started = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.seconds[name] += time.perf_counter() - started

    @contextlib.contextmanager
    def installed(self, optimizer: torch.optim.Optimizer) -> Iterator[None]:
        saved = (update_module.fill_reference_logprobs, update_module.completion_logprobs, update_module._accumulate,
                 optimizer.step)

        def fill(*args: Any, **kwargs: Any) -> Any:
            with self.timing("old_logprobs"):
                return saved[0](*args, **kwargs)

        def forward(model: Any, micro: Any, *args: Any, **kwargs: Any) -> Any:
            rows = [(len(s.prompt_ids), len(s.completion_ids)) for s in micro.seqs]
            self.tokens["real"] += sum(p + c for p, c in rows)
            self.tokens["real_trained" if torch.is_grad_enabled() else "real_old"] += sum(p + c for p, c in rows)
            self.tokens["padded"] += len(rows) * max(p + c for p, c in rows)
            self.tokens["packed"] += len(packed_rows([s.prompt_ids for s in micro.seqs],
                                                             [s.completion_ids for s in micro.seqs])[0])
            if not torch.is_grad_enabled():
                return saved[1](model, micro, *args, **kwargs)
            with self.timing("forward"):
                return saved[1](model, micro, *args, **kwargs)

        def accumulate(*args: Any, **kwargs: Any) -> Any:
            with self.timing("accumulate"):
                return saved[2](*args, **kwargs)

        def step(*args: Any, **kwargs: Any) -> Any:
            with self.timing("optimizer"):
                return saved[3](*args, **kwargs)

        update_module.fill_reference_logprobs, update_module.completion_logprobs = fill, forward
        update_module._accumulate, optimizer.step = accumulate, step  # type: ignore[method-assign]
        try:
            yield
        finally:
            (update_module.fill_reference_logprobs, update_module.completion_logprobs, update_module._accumulate,
             optimizer.step) = saved  # type: ignore[method-assign]


def gridrun_update(model: Any, rows: list[TrainSeq], settings: UpdateSettings, packed: bool, adapter: str,
                   sync: Callable[[], None]) -> dict[str, Any]:
    """One update of `adapter` on fresh copies of `rows`, packed or padded; its phases."""
    activate(model, adapter)
    if next(model.parameters()).device.type != "cpu":
        # On a GPU the trainer keeps transformers' sdpa (padded); the packed path needs gridrun's.
        model.get_base_model().set_attn_implementation(GROUPED_SDPA if packed else "sdpa")
    optimizer = torch.optim.AdamW(list(adapter_parameters(model, adapter).values()), lr=LR, weight_decay=0.0)
    seqs = [TrainSeq(s.role, adapter, s.prompt_ids, s.completion_ids, s.rollout_logp, s.advantage, s.truncated)
            for s in rows]
    phases = Phases(sync)
    applies = cpu.applies
    cpu.applies = lambda _model: packed and applies(_model)  # type: ignore[assignment]
    try:
        with phases.installed(optimizer), phases.timing("total"):
            metrics = update_module.update(model, Routing({r: adapter for r in ("aggregator", "generator")}, (adapter,)),
                                           {adapter: optimizer}, seqs, settings, {adapter: LR}, random.Random(0))
    finally:
        cpu.applies = applies  # type: ignore[assignment]
    s = phases.seconds
    split = {
        "old_logprobs": s["old_logprobs"], "forward": s["forward"], "backward": s["accumulate"] - s["forward"],
        "optimizer": s["optimizer"],
        "bookkeeping": s["total"] - s["old_logprobs"] - s["accumulate"] - s["optimizer"],
    }
    computed = phases.tokens["packed" if packed else "padded"]
    return {"s": s["total"], "phases": split, "tokens_computed": computed, "tokens_real": phases.tokens["real"],
            "tokens_trained": phases.tokens["real_trained"], "tokens_old": phases.tokens["real_old"],
            "pad_tokens": phases.tokens["padded"] - phases.tokens["real"] if not packed else 0,
            "opt_steps": metrics[f"adapter/{adapter}/opt_steps"]}


class TRLSide:
    """TRL's GRPO loss and backward on the same rows (the module docstring says how)."""

    def __init__(self, base: Any, tokenizer: Any, checkpointing: bool, device: torch.device) -> None:
        try:
            from datasets import Dataset
            from trl import GRPOConfig, GRPOTrainer
        except ImportError as err:
            raise SystemExit(f"bench/update.py needs TRL for its comparison ({err}): pip install -e '.[bench]', "
                             "or pass --no-trl") from None
        args = GRPOConfig(output_dir="/tmp/gridrun-bench-update-trl", use_cpu=device.type == "cpu",
                          per_device_train_batch_size=2, num_generations=2, learning_rate=LR, beta=0.0,
                          epsilon=0.2, epsilon_high=0.28, loss_type="grpo", temperature=TEMPERATURE, top_k=0,
                          max_grad_norm=GRAD_CLIP, gradient_checkpointing=checkpointing, bf16=False,
                          report_to="none", save_strategy="no", disable_tqdm=True, weight_decay=0.0)
        with contextlib.redirect_stdout(sys.stderr):
            self.trainer = GRPOTrainer(model=base, reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
                                       args=args, train_dataset=Dataset.from_list([{"prompt": "x"}] * 2),
                                       processing_class=tokenizer, peft_config=_lora())
        self.model = self.trainer.model
        self.model.train()
        self.pad_id = tokenizer.pad_token_id
        self.device = device

    def inputs(self, rows: list[TrainSeq]) -> dict[str, torch.Tensor]:
        from gridrun.train.padding import pad_rows

        prompt_ids, prompt_mask = pad_rows([s.prompt_ids for s in rows], self.pad_id, "left")
        completion_ids, completion_mask = pad_rows([s.completion_ids for s in rows], self.pad_id, "right")
        return {k: v.to(self.device) for k, v in {
            "prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "advantages": torch.tensor([s.advantage for s in rows]),
            "num_items_in_batch": completion_mask.sum()}.items()}

    def update(self, rows: list[TrainSeq], minibatch: int, micro_rows: int, sync: Callable[[], None]) -> dict[str, Any]:
        params = [p for p in self.model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)
        seconds: dict[str, float] = defaultdict(float)
        sync()
        started = time.perf_counter()
        # Mini-batches of consecutive rows, each cut into micro-batches of `micro_rows`.
        cuts = [[rows[first : first + micro_rows] for first in range(cut, min(cut + minibatch, len(rows)), micro_rows)]
                for cut in range(0, len(rows), minibatch)]
        old: list[list[torch.Tensor]] = []
        computed = 0
        with torch.no_grad():
            for micro in cuts:
                old.append([])
                for part in micro:
                    batch = self.inputs(part)
                    computed += len(part) * (batch["prompt_ids"].shape[1] + batch["completion_ids"].shape[1])
                    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
                    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
                    old[-1].append(self.trainer._get_per_token_logps_and_entropies(
                        self.model, ids, mask, batch["completion_ids"].shape[1], micro_rows)[0])
        sync()
        seconds["old_logprobs"] = time.perf_counter() - started
        for micro, olds in zip(cuts, old):
            # TRL's loop sets this per optimizer step; its loss divides by it.
            self.trainer.current_gradient_accumulation_steps = len(micro)
            for part, old_logps in zip(micro, olds):
                batch = self.inputs(part)
                batch["old_per_token_logps"] = old_logps
                computed += len(part) * (batch["prompt_ids"].shape[1] + batch["completion_ids"].shape[1])
                loss = self.trainer.compute_loss(self.model, batch)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        sync()
        total = time.perf_counter() - started
        return {"s": total, "phases": {"old_logprobs": seconds["old_logprobs"],
                                       "loss_backward_optimizer": total - seconds["old_logprobs"]},
                "tokens_computed": computed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Qwen/Qwen3-0.6B", help="a published Qwen3 name (random init) or toy")
    parser.add_argument("--layers", type=int, default=None,
                        help="keep the first N decoder layers (every layer is the same: time scales with N)")
    parser.add_argument("--problems", type=int, default=2)
    parser.add_argument("--n", type=int, default=4, help="episodes per problem")
    parser.add_argument("--response-tokens", type=int, default=256, help="R: the longest response")
    parser.add_argument("--prompt-tokens", type=int, default=None,
                        help="P: prompts uniform in [P/2, P] (default: [R/8, R/3], the paper's math shape)")
    parser.add_argument("--token-budget", type=int, default=2048, help="tokens per micro-batch (paper: 8 R at 1.7B)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats after one warm-up")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: on a shared CPU more threads wait for each other)")
    parser.add_argument("--checkpointing", action=argparse.BooleanOptionalAction, default=None,
                        help="gradient checkpointing (default: on, off for the toy world, as conf/ has it)")
    parser.add_argument("--no-trl", action="store_true", help="gridrun's packed and padded paths only")
    parser.add_argument("--no-padded", action="store_true", help="gridrun's packed path only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the device's dense peak for MFU (default: bf16 data sheets of H100/H200/A100/L40S)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    checkpointing = args.checkpointing if args.checkpointing is not None else args.model != "toy"
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    from peft import get_peft_model

    base = base_model(args.model, args.layers, dtype, device)
    vocab = base.config.vocab_size
    # Model FLOPs per token: 2 N forward, 4 N backward (N: the base's parameters, the tied
    # embedding once); attention's own FLOPs left out, as in the usual MFU.
    n_params = sum(p.numel() for p in base.parameters())
    peak = peak_tflops(device, dtype, args.peak_tflops)
    rows = draw_rows(args.problems, args.n, args.response_tokens, vocab, args.seed, args.prompt_tokens)
    paths = ["packed"] + ([] if args.no_padded else ["padded"])
    model = get_peft_model(base, _lora(), adapter_name=paths[0])
    for name in paths[1:]:
        model.add_adapter(name, _lora())
    if checkpointing:
        model.get_base_model().gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    minibatch = args.problems * args.n
    settings = UpdateSettings(grpo=GRPOSpec(), minibatch_size=minibatch, micro_token_budget=args.token_budget,
                              temperature=TEMPERATURE, grad_clip=GRAD_CLIP, pad_id=0)
    trl = None
    if not args.no_trl:
        from transformers import AutoTokenizer

        from gridrun.cellrun import model_files
        from gridrun.seam.runconfig import ModelSpec, ToySpec
        from gridrun.train.random_init import tokenizer_dir

        toy = model_files(ModelSpec(name_or_path="toy", toy=ToySpec()))
        tokenizer = AutoTokenizer.from_pretrained(toy if args.model == "toy" else tokenizer_dir(Path(toy)),
                                                  padding_side="left")
        trl = TRLSide(base_model(args.model, args.layers, dtype, device), tokenizer, checkpointing, device)
    micro_rows = max(1, args.token_budget // max(len(s.prompt_ids) + len(s.completion_ids) for s in rows))
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for _ in range(args.repeats + 1):
        for path in paths:
            runs[path].append(gridrun_update(model, rows, settings, path == "packed", path, sync))
        if trl is not None:
            runs["trl"].append(trl.update(rows, minibatch, micro_rows, sync))
    timed = {path: results[1:] for path, results in runs.items()}

    def median(values: Any) -> float:
        return round(statistics.median(values), 4)

    real = sum(len(s.prompt_ids) + len(s.completion_ids) for s in rows)
    completions = [len(s.completion_ids) for s in rows if s.role == "generator"]
    result: dict[str, Any] = {
        "model": args.model, "layers": base.config.num_hidden_layers, "device": str(device), "dtype": args.dtype,
        "threads": torch.get_num_threads(), "checkpointing": checkpointing, "rows": len(rows),
        "row_tokens": real, "generator_response_p50_p90_max": [int(statistics.median(completions)),
                                                                sorted(completions)[int(0.9 * len(completions))],
                                                                max(completions)],
        "token_budget": args.token_budget, "trl_micro_rows": micro_rows, "params": n_params,
        "peak_tflops": peak, "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }
    for path, results in timed.items():
        seconds = median(r["s"] for r in results)
        entry = {"s": seconds, "tokens_per_s": round(real / seconds, 1),
                 "phases": {k: median(r["phases"][k] for r in results) for k in results[0]["phases"]},
                 "tokens_computed": results[0]["tokens_computed"]}
        if path != "trl":
            flops = n_params * (6 * results[0]["tokens_trained"] + 2 * results[0]["tokens_old"])
            entry["model_tflops_per_s"] = round(flops / seconds / 1e12, 2)
            if peak:
                entry["mfu"] = round(flops / seconds / 1e12 / peak, 4)
            entry["pad_fraction"] = round(results[0]["pad_tokens"] / results[0]["tokens_computed"], 4)
            entry["opt_steps"] = results[0]["opt_steps"]
        else:
            entry["pad_fraction"] = round(1 - real / results[0]["tokens_computed"], 4)
        result[path] = entry
    for path in paths:
        for other in ("padded", "trl"):
            if other in timed and other != path:
                result[f"{path}_over_{other}"] = median(a["s"] / b["s"] for a, b in zip(timed[path], timed[other]))
    if trl is not None:
        result["trl_version"] = __import__("trl").__version__
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
