"""Build (once) and cache the toy world: tokenizer, tiny Qwen3 model, supervised warm start.

`ensure_toy_world(spec)` returns a directory loadable with `from_pretrained`, exactly like a
hub checkpoint, so the trainer's loading code is the same for `scale=toy` and Qwen3. The
directory is keyed by a hash of the recipe (spec + this module's constants), built under a
file lock (parallel cells wait for one build), written to a temp dir and renamed.

The warm start trains on every role's transcripts (gridrun/toy/transcripts.py) and stops at
the first evaluation whose greedy `single` accuracy on held-out problems reaches
`spec.target_accuracy`: the skill appears abruptly, so stopping on the measurement rather
than on a step count keeps the base accuracy inside the band the demo needs.
Deterministic per seed: fixed data order, seeded init, one intra-op thread per process.

The warm start runs as WARM_RANKS data-parallel processes (spawned, gloo on localhost): each
computes the gradient of its share of every batch, the shares are summed, and every rank
takes the same optimizer step. The rank count is part of the recipe, not read from the
machine, because it fixes the gradient's summation order and hence the weights.

The default world ships inside the package (`gridrun/toy/world/`, a few MB): every machine
loads the same bytes in milliseconds, whatever its CPU. A rebuild is deterministic on one
machine, but float32 kernels sum in another order on another instruction set (AVX2 against
AVX-512), so a rebuild elsewhere is a sibling world of the same recipe, not the same bytes:
`gridrun toy build --rebuild` makes one and says whether it matches.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from gridrun.seam.errors import UserError
from gridrun.seam.runconfig import ToySpec
from gridrun.tasks.arith import make_problems
from gridrun.toy import transcripts
from gridrun.train.distributed import Dist, free_local_port
from gridrun.train.padding import pad_rows

log = logging.getLogger("gridrun")

# Bump when anything below changes what gets built: it is part of the cache key.
RECIPE_VERSION = 4
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
VOCAB_SIZE = 384
MODEL = {
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    # vLLM's CPU attention needs head_dim in {32, 64, 80, 96, 112, 128, ...}.
    "head_dim": 32,
    "intermediate_size": 512,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
    "rope_theta": 10000.0,
}
# Float32 throughout, no autocast: bfloat16 saved ~10% on CPUs with AVX512-BF16 but ran 17x
# slower on CPUs without it (emulated), and its kernels differ between the two, so the
# "same" recipe built another world on each (version 2: 300 steps and 40.5% on one machine,
# 375 steps and 36.0% on another).
WARM: dict[str, Any] = {"batch": 64, "lr": 3e-3, "betas": (0.9, 0.98), "weight_decay": 0.01, "warmup": 50, "clip": 1.0}
# A batch is sorted by length and cut into this many micro-batches: transcripts range from
# ~40 tokens (generator) to ~180 (synthesizer), so padding to the batch maximum would waste
# most of the compute.
MICRO_BATCHES = 8
WARM_RANKS = 2
EVAL_EVERY, EVAL_FROM, EVAL_PROBLEMS = 25, 150, 200
# Qwen-style chat template; with enable_thinking=false the assistant turn opens with an
# empty think block, as Qwen3's own template does.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


# The default recipe's world, built once and committed; build.json records its recipe hash
# and the sha256 of every file.
SHIPPED = Path(__file__).parent / "world"


class ToyWorldError(UserError, RuntimeError):
    pass


def cache_root() -> Path:
    return Path(os.environ.get("GRIDRUN_CACHE", Path.home() / ".cache" / "gridrun"))


def recipe(spec: ToySpec) -> dict:
    return {
        "version": RECIPE_VERSION,
        "spec": dataclasses.asdict(spec),
        "model": MODEL,
        "vocab": VOCAB_SIZE,
        "warm": WARM,
        "mix": transcripts.ROLE_MIX,
        "strategies": transcripts.STRATEGIES,
        "mistakes": [transcripts.P_WRONG_SUM, transcripts.P_WRONG_CHECK, transcripts.P_WRONG_PICK,
                     transcripts.P_REPEATED_STRATEGY],
        "full_context": transcripts.P_FULL_CONTEXT,
        "eval": [EVAL_EVERY, EVAL_FROM, EVAL_PROBLEMS],
        "parallel": [MICRO_BATCHES, WARM_RANKS],
    }


def recipe_hash(spec: ToySpec) -> str:
    return hashlib.sha256(json.dumps(recipe(spec), sort_keys=True).encode()).hexdigest()[:16]


def file_hashes(world: Path) -> dict[str, str]:
    """sha256 of every file of a built world but its build record."""
    return {
        f.name: hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(world.iterdir()) if f.is_file() and f.name != "build.json"
    }


def shipped_world(spec: ToySpec) -> Path | None:
    """The shipped world if `spec` is its recipe (its files checked against the record), else None."""
    record = SHIPPED / "build.json"
    if not record.exists():
        return None
    info = json.loads(record.read_text())
    if info.get("recipe_hash") != recipe_hash(spec):
        return None
    found = file_hashes(SHIPPED)
    if found != info["files"]:
        bad = sorted(set(found.items()) ^ set(info["files"].items()))
        raise ToyWorldError(
            f"the shipped toy world in {SHIPPED} is damaged ({bad[0][0]} differs from build.json): "
            "restore it with `git checkout -- gridrun/toy/world` or reinstall gridrun"
        )
    return SHIPPED


def ensure_toy_world(spec: ToySpec) -> Path:
    """The toy world for this recipe: the shipped one, else the cached build, built first if needed."""
    shipped = shipped_world(spec)
    if shipped is not None:
        return shipped
    root = cache_root() / "toy"
    target = root / recipe_hash(spec)
    if (target / "build.json").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "build.json").exists():
            return target
        staging = root / f".{target.name}.{os.getpid()}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        build(spec, staging)
        if (target / "build.json").exists():
            # Built meanwhile by a process that did not share this lock (another cache mount).
            shutil.rmtree(staging, ignore_errors=True)
        else:
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staging, target)
    return target


def rebuild(spec: ToySpec) -> Path:
    """Build `spec`'s world afresh into the cache (beside, never over, the world cells use)."""
    out = cache_root() / "toy" / f"{recipe_hash(spec)}.rebuilt"
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    build(spec, out)
    return out


def _chat(tokenizer: PreTrainedTokenizerFast, messages: transcripts.Messages) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)


def train_tokenizer(corpus: list[str]) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\d"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
    )


def _encode_examples(
    tokenizer: PreTrainedTokenizerFast, examples: list[transcripts.Example]
) -> list[tuple[list[int], int]]:
    """(prompt + response + <|im_end|> ids, prompt length) per example."""
    prompts = tokenizer([_chat(tokenizer, m) for m, _ in examples], add_special_tokens=False)["input_ids"]
    responses = tokenizer([r + "<|im_end|>" for _, r in examples], add_special_tokens=False)["input_ids"]
    return [(p + r, len(p)) for p, r in zip(prompts, responses)]


def _batch(encoded: list[tuple[list[int], int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    input_ids, attention = pad_rows([ids for ids, _ in encoded], pad_id, "right")
    # The loss is on the response only: prompt positions and padding are ignored (-100).
    labels, _ = pad_rows([[-100] * prompt_len + ids[prompt_len:] for ids, prompt_len in encoded], -100, "right")
    return input_ids, attention, labels


def greedy_correct(model: Qwen3ForCausalLM, tokenizer: PreTrainedTokenizerFast, problems: list) -> int:
    """How many `problems` greedy `single` solves, through the same engine and reward the trainer uses."""
    from gridrun.tasks.arith import ArithTask
    from gridrun.train.engines.hf import HFEngine
    from gridrun.train.rollout import GenRequest, SamplingParams

    # math-verify, as when the recipe was fixed: the warm start stops at the first evaluation
    # reaching the target, so another grader could stop it elsewhere and make another world
    # under the same recipe hash (the cache key).
    task = ArithTask(grader="math_verify")
    engine = HFEngine(model, tokenizer)
    prompts = tokenizer([_chat(tokenizer, task.prompts["generator"](p.question)) for p in problems], add_special_tokens=False)
    outs = engine.generate(
        [GenRequest(ids, None) for ids in prompts["input_ids"]], SamplingParams(temperature=0.0, max_new_tokens=24)
    )
    return sum(task.score(o.text, p).correct for o, p in zip(outs, problems))


def _micro_batch_owner(index: int, world: int) -> int:
    """Rank of the index-th micro-batch (sorted by length) in a snake order: 0,1,1,0,0,1,..."""
    lap, offset = divmod(index, world)
    return offset if lap % 2 == 0 else world - 1 - offset


def build(spec: ToySpec, out: Path, ranks: int = WARM_RANKS) -> None:
    """Run the warm start as `ranks` spawned processes; rank 0 writes `out`. The cached world
    always uses WARM_RANKS; another count builds other weights (bench/toy_build.py times it)."""
    started = time.time()
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_local_port()), "WORLD_SIZE": str(ranks)}
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(
            target=_build_rank, args=(spec, out, started, {**env, "RANK": str(rank)}, log.getEffectiveLevel()),
            name=f"toy-build-{rank}", daemon=True,
        )
        for rank in range(ranks)
    ]
    for process in processes:
        process.start()
    try:
        pending = list(processes)
        while pending:
            multiprocessing.connection.wait([p.sentinel for p in pending])
            for process in [p for p in pending if not p.is_alive()]:
                pending.remove(process)
                if process.exitcode != 0:
                    raise RuntimeError(
                        f"toy world build: {process.name} exited with {process.exitcode} (its traceback is above); "
                        f"nothing was cached, so the next run retries the build"
                    )
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
            process.join()


def _build_rank(spec: ToySpec, out: Path, started: float, env: dict[str, str], log_level: int) -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    log.setLevel(log_level)
    torch.set_num_threads(1)  # reduction order, hence the weights, must not depend on the machine
    # The build is CPU work by recipe: gloo, even where CUDA is available.
    dist = Dist.from_env(env, backend="gloo")
    try:
        _build(spec, out, started, dist)
    finally:
        dist.close()


def _build(spec: ToySpec, out: Path, started: float, dist: Dist) -> None:
    if dist.is_main:
        log.info("building the toy world (seed %d) into %s", spec.seed, out)
    rng = random.Random(spec.seed)
    torch.manual_seed(spec.seed)
    train, _ = make_problems(seed=0, n_train=5000, n_val=400)
    # Warm-start evaluation uses train problems held out from the transcripts, never val.
    eval_problems, warm_problems = train[:EVAL_PROBLEMS], train[EVAL_PROBLEMS:]

    bootstrap = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), chat_template=CHAT_TEMPLATE)
    corpus = [_chat(bootstrap, m) + r + "<|im_end|>" for m, r in transcripts.sample_examples(warm_problems, 4000, rng)]
    tokenizer = train_tokenizer(corpus)

    config = Qwen3Config(
        vocab_size=len(tokenizer),
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        **MODEL,
    )
    model = Qwen3ForCausalLM(config)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WARM["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=WARM["lr"],
        betas=WARM["betas"],
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / WARM["warmup"]))
    curve: list[tuple[int, float]] = []
    step, accuracy = 0, 0.0
    model.train()
    while step < spec.max_warm_steps:
        examples = transcripts.sample_examples(warm_problems, WARM["batch"], rng)
        encoded = sorted(_encode_examples(tokenizer, examples), key=lambda e: len(e[0]))
        n_targets = sum(len(ids) - start for ids, start in encoded)
        size = -(-len(encoded) // MICRO_BATCHES)
        micro_batches = [encoded[first : first + size] for first in range(0, len(encoded), size)]
        batch_loss = 0.0
        for index, micro_batch in enumerate(micro_batches):
            if _micro_batch_owner(index, dist.world) != dist.rank:
                continue
            input_ids, attention, labels = _batch(micro_batch, tokenizer.pad_token_id)
            logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1]
            # Token-mean over the whole batch, whatever the micro-batch split.
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum"
            ) / n_targets
            loss.backward()
            batch_loss += loss.item()
        dist.all_reduce_grads(model.parameters())
        torch.nn.utils.clip_grad_norm_(model.parameters(), WARM["clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        step += 1
        if step >= EVAL_FROM and step % EVAL_EVERY == 0:
            correct = greedy_correct(model, tokenizer, dist.shard(eval_problems))
            total_correct, batch_loss = dist.all_reduce_sum([float(correct), batch_loss])
            accuracy = total_correct / len(eval_problems)
            model.train()
            curve.append((step, accuracy))
            if dist.is_main:
                log.info("toy warm start step %d: loss %.3f, greedy accuracy %.3f", step, batch_loss, accuracy)
            if accuracy >= spec.target_accuracy:
                break
        elif step % EVAL_EVERY == 0 and dist.is_main:
            # Before EVAL_FROM the model cannot add yet: say only that the build is moving.
            log.info("toy warm start step %d (%.0f s)", step, time.time() - started)
    if not dist.is_main:
        return
    out.mkdir(parents=True)
    model.generation_config.do_sample = False
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    info = {
        "recipe": recipe(spec), "recipe_hash": recipe_hash(spec), "ranks": dist.world, "steps": step,
        "accuracy": accuracy, "curve": curve, "seconds": time.time() - started, "files": file_hashes(out),
    }
    (out / "build.json").write_text(json.dumps(info, indent=1))
