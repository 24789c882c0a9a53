"""`engine=hf`: rollouts on the trainer's own (peft) model, with transformers' `generate` or,
for Qwen3 on the CPU, gridrun's own decoding loop that computes what generate does
(gridrun/train/cpu/qwen3_decode.py: the same tokens and log-probs to the bit, a fifth faster on the toy world).

Requests are grouped by adapter (one `set_adapter` per group, the base model through
`disable_adapter`), left-padded into sub-batches and sampled with plain temperature
sampling (no top-k; top-p only when configured), so the recorded log-probs are those of
softmax(logits / T), the distribution the trainer's ratio is computed against.

The sampled tokens' log-probs are taken one decoding step at a time (`_SampledLogprobs`),
never by keeping every step's logits: at Qwen3's 151,936-entry vocabulary that would be
2.5 GB per sequence of 5,120 tokens.

With float32 weights each adapter is merged into the base weights while it generates
(`_merged`; plain LoRA layers on the CPU by gridrun/train/cpu/lora_kernels.py's `merged_weight`, peft's merge bit for bit
without its bookkeeping): one matrix product per linear layer instead of peft's three and its
Python wrapper, about a fifth of the toy rollout's CPU time. The merged weights are new tensors
and the originals are put back untouched, so the base model the update trains on is
bit-for-bit the same; only the rollout's float rounding differs (W + BA versus W, A, B
applied in turn), as a vLLM engine's does. Half-precision weights are never merged: the
LoRA delta would be rounded into bf16, sampling from another policy than the trained one.
The merged copies double the wrapped weights' memory while a rollout runs, so by default
only models whose wrapped weights fit `MERGE_COPY_LIMIT_BYTES` are merged (the toy's are
4 MB; a float32 Qwen3-0.6B's 1.8 GB are not).

A prompt that repeats in a batch (a problem's n samples, the voters of one question) is
prefilled once: its cache of every column but the last is copied to its rows and decoding
starts at the last column for all of them (`_prefill`; the lean loop always starts so). The
same seed draws the same tokens as a full prefill; the logits differ only by float rounding
(tests/test_rollout.py).

Left out: per-request seeds (sampling draws from torch's global RNG, which checkpoints
save); paged KV memory (each sub-batch's cache is sized to its longest prompt plus the
response limit): clusters use `engine=vllm`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from peft.tuners.lora import LoraLayer
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from gridrun.arch import families
from gridrun.train import cpu
from gridrun.train.cpu import qwen3_decode
from gridrun.train.cpu.lora_kernels import merged_weight, plain_float32_lora
from gridrun.train.logprobs import prompt_owners
from gridrun.train.padding import generate_positions, pad_rows
from gridrun.train.policy import switch_adapter
from gridrun.train.rollout import Completion, GenRequest, RolloutEngine, SamplingParams

# The largest merged copy of the LoRA-wrapped base weights the engine makes unasked.
MERGE_COPY_LIMIT_BYTES = 1 << 30


def stop_token_ids(tokenizer: Any, model: Any = None) -> list[int]:
    """End-of-turn tokens: the tokenizer's eos and every eos of the model's generation_config
    (Gemma 3's <end_of_turn>, Phi-4-mini's <|end|>: gridrun/arch/families.py), and ChatML's
    two ends where the vocabulary has them (Qwen3's tokenizer names only <|im_end|>; the toy
    world's generation_config only one of them)."""
    generation_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    chatml = {tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    ids = set(families.stop_ids(tokenizer.eos_token_id, generation_eos)) | chatml
    return sorted(i for i in ids if isinstance(i, int) and i != tokenizer.unk_token_id)


class _SampledLogprobs(LogitsProcessor):
    """Records log softmax(logits / T) of each sampled token as decoding goes.

    generate applies custom processors before its temperature and top-p warpers, so the
    scores seen here are the raw logits. The token drawn from one step's scores is the last
    column of the next call's input_ids; the final step's token is read in `finish`.
    """

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self.previous: torch.Tensor | None = None  # (batch, vocab) log-probs of the last step
        self.taken: list[torch.Tensor] = []  # (batch,) per generated token

    def _take(self, tokens: torch.Tensor) -> None:
        if self.previous is not None:
            self.taken.append(self.previous.gather(-1, tokens.unsqueeze(-1)).squeeze(-1))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._take(input_ids[:, -1])
        self.previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, generated: torch.Tensor) -> torch.Tensor:
        """(batch, new_tokens) log-probs of `generated`, the tokens after the prompt."""
        self._take(generated[:, -1])
        self.previous = None
        return torch.stack(self.taken, dim=1)


@contextlib.contextmanager
def _merged(layers: list[Any], adapter: str, cpu_fast: bool) -> Iterator[None]:
    """Serve `adapter` merged into new copies of the base weights of `layers` (the model's
    LoRA layers); the original weight tensors are put back afterwards, untouched (the update
    trains on them)."""
    served = [layer for layer in layers if adapter in layer.lora_A]
    originals = [layer.get_base_layer().weight.data for layer in served]
    try:
        for layer in served:
            if cpu_fast and plain_float32_lora(layer):
                layer.get_base_layer().weight.data = merged_weight(layer, adapter)
            else:
                # safe_merge writes W + BA into a new tensor (and refuses a non-finite adapter).
                layer.merge(safe_merge=True, adapter_names=[adapter])
            # Merged, the layer computes its base layer's output and nothing else: call that
            # directly, past peft's per-call checks (on the toy model they cost more than the matmul).
            layer.forward = layer.get_base_layer().forward
        yield
    finally:
        for layer, weight in zip(served, originals):
            layer.__dict__.pop("forward", None)
            layer.get_base_layer().weight.data = weight
            layer.merged_adapters.clear()


class HFEngine(RolloutEngine):
    def __init__(self, model: Any, tokenizer: Any, max_batch_size: int = 512, merge_lora: bool | None = None,
                 share_prefill: bool = True, lean_decode: bool = True) -> None:
        """merge_lora: serve each adapter merged into copies of the base weights (None:
        when every LoRA-wrapped weight is float32 and they fit MERGE_COPY_LIMIT_BYTES;
        see the module docstring). share_prefill: compute a repeated prompt's prefill once.
        lean_decode: decode with gridrun's Qwen3 loop where it applies (qwen3_decode.py),
        else transformers' generate."""
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.stop_ids = stop_token_ids(tokenizer, model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        self.device = next(model.parameters()).device
        self.lora_layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
        wrapped = [m.get_base_layer().weight for m in self.lora_layers]
        fits = sum(w.numel() * w.element_size() for w in wrapped) <= MERGE_COPY_LIMIT_BYTES
        auto = fits and all(w.dtype == torch.float32 for w in wrapped)
        self.merge_lora = auto if merge_lora is None else merge_lora
        self.share_prefill = share_prefill
        self.causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        # The CPU fast paths (gridrun/train/cpu/): the lean loop and the plain merge.
        self.cpu_fast = cpu.applies(model)
        # Why the lean Qwen3 loop cannot serve this model (None: it can), checked once.
        self.lean_blocker = qwen3_decode.unsupported(self.causal_lm) if lean_decode else "lean_decode is off"

    @contextlib.contextmanager
    def _serving(self, adapter: str | None) -> Iterator[None]:
        is_peft = hasattr(self.model, "peft_config")
        if adapter is None:
            with self.model.disable_adapter() if is_peft else contextlib.nullcontext():
                yield
            return
        if not is_peft or adapter not in self.model.peft_config:
            raise KeyError(f"adapter '{adapter}' is not loaded in the rollout model")
        previous = switch_adapter(self.model, adapter)
        try:
            with _merged(self.lora_layers, adapter, self.cpu_fast) if self.merge_lora else contextlib.nullcontext():
                yield
        finally:
            switch_adapter(self.model, previous)

    def generate(self, requests: Sequence[GenRequest], sampling: SamplingParams) -> list[Completion]:
        results: list[Completion | None] = [None] * len(requests)
        groups: dict[str | None, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(request.adapter, []).append(i)
        was_training = self.model.training
        self.model.eval()
        try:
            for adapter, indices in groups.items():
                # The lean loop reads the base weights: right where they are what is served.
                # (top-p sampling is generate's warper).
                lean = self.lean_blocker is None and (adapter is None or self.merge_lora) and sampling.top_p >= 1.0
                with self._serving(adapter):
                    for start in range(0, len(indices), self.max_batch_size):
                        chunk = indices[start : start + self.max_batch_size]
                        prompts = [requests[i].prompt_ids for i in chunk]
                        for i, done in zip(chunk, self._generate(prompts, sampling, lean)):
                            results[i] = done
        finally:
            self.model.train(was_training)
        return [r for r in results if r is not None]

    def _prefill(self, prompts: list[list[int]], input_ids: torch.Tensor, attention: torch.Tensor,
                 always: bool) -> Any:
        """The cache of every column but the last, each distinct prompt's computed once and
        copied to its rows (each row its own with share_prefill off); decoding then starts at
        the last column. None where prompts are one column wide, or, unless `always`, where
        no prompt repeats or sharing is off (generate then prefills every column itself)."""
        if input_ids.shape[1] < 2:
            return None
        distinct, owners = prompt_owners(prompts) if self.share_prefill else (prompts, list(range(len(prompts))))
        if len(distinct) == len(prompts) and not always:
            return None
        first_row = {owner: row for row, owner in reversed(list(enumerate(owners)))}
        rows = torch.tensor([first_row[i] for i in range(len(distinct))], device=self.device)
        mask = attention[rows, :-1]
        cache = self.causal_lm.model(
            input_ids=input_ids[rows, :-1], attention_mask=mask, position_ids=generate_positions(mask), use_cache=True
        ).past_key_values
        cache.reorder_cache(torch.tensor(owners, device=self.device))
        return cache

    @torch.inference_mode()
    def _generate(self, prompts: list[list[int]], sampling: SamplingParams, lean: bool) -> list[Completion]:
        input_ids, attention = pad_rows(prompts, self.pad_id, "left")
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        cache = self._prefill(prompts, input_ids, attention, always=lean)
        if lean and cache is not None:
            generated, logprobs = qwen3_decode.sample(
                self.causal_lm, input_ids[:, -1:], attention, cache, sampling.temperature, sampling.max_new_tokens,
                self.stop_ids, self.pad_id,
            )
        else:
            greedy = sampling.temperature <= 0
            # top_k=0 switches off transformers' default top-50 truncation when sampling.
            sampler = {} if greedy else {"temperature": sampling.temperature, "top_k": 0, "top_p": sampling.top_p}
            config = GenerationConfig(
                max_new_tokens=sampling.max_new_tokens,
                do_sample=not greedy,
                eos_token_id=self.stop_ids,
                pad_token_id=self.pad_id,
                **sampler,
            )
            recorder = _SampledLogprobs(1.0 if greedy else sampling.temperature)
            sequences = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                generation_config=config,
                logits_processor=LogitsProcessorList([recorder]),
                **({"past_key_values": cache} if cache is not None else {}),
            )
            generated = sequences[:, input_ids.shape[1] :]
            logprobs = recorder.finish(generated)
        stops = torch.tensor(self.stop_ids, device=generated.device)
        completions = []
        for row in range(len(prompts)):
            tokens = generated[row].tolist()
            hits = torch.isin(generated[row], stops).nonzero()
            if len(hits):
                end, reason = int(hits[0]) + 1, "stop"
            else:
                end, reason = len(tokens), "length"
            completions.append(
                Completion(
                    token_ids=tokens[:end],
                    logprobs=logprobs[row, :end].tolist(),
                    text=self.tokenizer.decode(tokens[:end], skip_special_tokens=True),
                    finish_reason=reason,
                )
            )
        return completions
