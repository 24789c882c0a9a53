"""Stage-batched rollouts: run many workflow episodes as coroutines, batch their LLM calls.

Workflows are plain async programs over `await llm.chat(role, messages)`. Every call is
queued; when every live thread of control of every episode is waiting on a call, the
whole queue goes to the engine as one batch, each request routed to its role's adapter.
So a Voting step issues one batch of all voters' calls, then one of all aggregators'.

Concurrent calls inside an episode use `llm.parallel(...)`, not `asyncio.gather`: the
batcher counts threads of control to know when everyone is waiting (a gather it cannot
see would make it flush too early; it detects that and says so).

The engine interface (`RolloutEngine`) is what `engine=hf` and `engine=vllm` implement.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from gridrun.tasks.base import Messages
from gridrun.train.episode import Episode, Turn

T = TypeVar("T")


@dataclass(frozen=True)
class SamplingParams:
    # 0 means greedy.
    temperature: float
    max_new_tokens: int
    top_p: float = 1.0


@dataclass(frozen=True)
class GenRequest:
    prompt_ids: list[int]
    # Adapter name to serve this request with; None = the base model.
    adapter: str | None


@dataclass
class Completion:
    token_ids: list[int]
    # Per-token log-probs of token_ids under softmax(logits / temperature) (raw logits if greedy).
    logprobs: list[float]
    text: str
    finish_reason: str


class AdapterNotServed(RuntimeError):
    """The rollout engine does not serve a role the adapter the trainer holds (one line)."""


class RolloutEngine(ABC):
    """Generates completions for a batch of tokenized prompts, each on its own adapter."""

    @abstractmethod
    def generate(self, requests: Sequence[GenRequest], sampling: SamplingParams) -> list[Completion]: ...

    def refresh(self) -> None:
        """Engines holding their own copy of the adapters reload them from the trainer's model here."""

    def refresh_proven(self, step: int, role_adapter: Mapping[str, str | None]) -> dict[str, float]:
        """Called after every optimizer update (and when a run starts or resumes): refresh(),
        then show that each role's requests are served its adapter's current weights, raising
        AdapterNotServed (one line) when not. Returns the proof's metrics. An engine that
        serves the trainer's own model has nothing to prove."""
        self.refresh()
        return {}

    def sleep(self) -> None:
        """Called before the update: engines sharing the GPU with training free memory here."""

    def check_agreement(self, update_metrics: dict[str, float]) -> None:
        """Called after the update with its metrics: engines serving their own copy of the
        weights raise when their rollout log-probs disagree with the trainer's."""

    def close(self) -> None:
        """Release engine resources."""


class ChatEncoder:
    """Applies the chat template (thinking disabled for Qwen3) and tokenizes prompts."""

    def __init__(self, tokenizer: Any, enable_thinking: bool, max_prompt_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.enable_thinking = enable_thinking
        self.max_prompt_tokens = max_prompt_tokens

    def encode(self, messages_list: Sequence[Messages]) -> list[list[int]]:
        texts = [
            self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, enable_thinking=self.enable_thinking
            )
            for messages in messages_list
        ]
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]


@dataclass
class _Pending:
    episode: Episode
    seq: int
    role: str
    slot: int
    round: int
    messages: Messages
    future: asyncio.Future[Turn]


class WorkflowMisuse(RuntimeError):
    pass


class EpisodeLLM:
    """The `llm` a workflow program sees: records every turn into its episode."""

    def __init__(self, batcher: StageBatcher, episode: Episode) -> None:
        self._batcher = batcher
        self.episode = episode
        self._seq = 0

    async def chat(self, role: str, messages: Messages, *, slot: int = 0, round: int = 0) -> Turn:
        self._seq += 1
        future: asyncio.Future[Turn] = asyncio.get_running_loop().create_future()
        self._batcher._submit(_Pending(self.episode, self._seq, role, slot, round, messages, future))
        turn = await future
        self.episode.turns.append(turn)
        return turn

    async def parallel(self, *calls: Awaitable[T]) -> list[T]:
        """Run calls concurrently (same-role slots); results in argument order."""
        if not calls:
            return []
        batcher = self._batcher
        batcher._active += len(calls) - 1
        remaining = len(calls)

        async def branch(call: Awaitable[T]) -> T:
            nonlocal remaining
            try:
                return await call
            finally:
                remaining -= 1
                # The last branch to finish hands its count back to the resuming parent.
                if remaining > 0:
                    batcher._active -= 1
                    batcher._maybe_flush()

        return list(await asyncio.gather(*(branch(c) for c in calls)))


WorkflowProgram = Callable[[EpisodeLLM, Episode], Coroutine[Any, Any, None]]


@dataclass(frozen=True)
class StageCost:
    """One engine call of a rollout: its requests, wall seconds and generated tokens."""

    requests: int
    seconds: float
    tokens: int


class StageBatcher:
    def __init__(
        self,
        engine: RolloutEngine,
        encoder: ChatEncoder,
        route: Callable[[str], str | None],
        sampling: SamplingParams,
    ) -> None:
        self.engine = engine
        self.encoder = encoder
        self.route = route
        self.sampling = sampling
        self._pending: list[_Pending] = []
        self._active = 0
        self._sequential = False
        self.batches: list[int] = []
        # Each engine call of the run, in order: what `gridrun canary` reports per stage.
        self.stages: list[StageCost] = []

    def run(self, episodes: Sequence[Episode], program: WorkflowProgram, sequential: bool = False) -> None:
        """Run `program` on every episode. sequential=True runs one episode and one call at a
        time (the unbatched baseline the benchmark compares against)."""
        self._sequential = sequential
        if sequential:
            for episode in episodes:
                asyncio.run(self._run_all([episode], program))
        else:
            asyncio.run(self._run_all(list(episodes), program))

    async def _run_all(self, episodes: list[Episode], program: WorkflowProgram) -> None:
        self._pending, self._active = [], len(episodes)

        async def one(episode: Episode) -> None:
            try:
                await program(EpisodeLLM(self, episode), episode)
            finally:
                self._active -= 1
                self._maybe_flush()

        await asyncio.gather(*(one(e) for e in episodes))

    def _submit(self, pending: _Pending) -> None:
        self._pending.append(pending)
        if len(self._pending) > self._active:
            raise WorkflowMisuse(
                "more pending LLM calls than threads of control: run concurrent calls with "
                "`await llm.parallel(...)`, not asyncio.gather or create_task"
            )
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if self._pending and len(self._pending) == self._active:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        if not self._pending or len(self._pending) != self._active:
            return
        # Deterministic order whatever the coroutine interleaving: sampling RNG is consumed
        # in batch order, so this is what makes rollouts reproducible.
        batch = sorted(self._pending, key=lambda p: (p.episode.problem.id, p.episode.sample, p.seq))
        self._pending = []
        try:
            chunks = [[p] for p in batch] if self._sequential else [batch]
            for chunk in chunks:
                self._serve(chunk)
        except BaseException as err:  # noqa: BLE001 - handed to every waiting episode
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(err)

    def _serve(self, chunk: list[_Pending]) -> None:
        prompt_ids = self.encoder.encode([p.messages for p in chunk])
        limit = self.encoder.max_prompt_tokens
        fits = [i for i, ids in enumerate(prompt_ids) if len(ids) <= limit]
        requests = [GenRequest(prompt_ids[i], self.route(chunk[i].role)) for i in fits]
        self.batches.append(len(requests))
        started = time.perf_counter()
        completions = self.engine.generate(requests, self.sampling) if requests else []
        tokens = sum(len(c.token_ids) for c in completions)
        self.stages.append(StageCost(len(requests), time.perf_counter() - started, tokens))
        served = dict(zip(fits, completions))
        for i, p in enumerate(chunk):
            done = served.get(i) or Completion([], [], "", "prompt_too_long")
            p.future.set_result(
                Turn(
                    role=p.role,
                    slot=p.slot,
                    round=p.round,
                    messages=p.messages,
                    prompt_ids=prompt_ids[i],
                    completion_ids=done.token_ids,
                    logprobs=done.logprobs,
                    text=done.text,
                    finish_reason=done.finish_reason,
                )
            )
