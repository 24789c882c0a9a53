"""Rollouts: run many workflow episodes as coroutines and serve their LLM calls, staged or continuous.

Workflows are plain async programs over `await llm.chat(role, messages)`. Two ways to serve them:

- staged (every engine; the only way for `engine=hf`): every call is queued; when every live
  thread of control of every episode is waiting on a call, the whole queue goes to the engine
  as one batch, each request routed to its role's adapter. So a Voting step issues one batch
  of all voters' calls, then one of all aggregators'; each stage waits for its longest response.
- continuous (engines with `continuous = True`: `engine=vllm`): each call goes to the engine as
  soon as it is made, and the engine steps its running batch, handing back each request as it
  finishes; the episode then makes its next call at once. No episode waits for another's
  straggler (the released rLLM code runs each episode as its own task against an async engine).

Engines that seed each request (`seeds_requests`) get a seed that is a function of the
rollout's one draw from torch's RNG, the episode's index and the call's index in its episode
(`seeds.request_seed`): the same in both ways, so both give the same episodes.

Concurrent calls inside an episode use `llm.parallel(...)`, not `asyncio.gather`: the
batcher counts threads of control to know when everyone is waiting (a gather it cannot
see would make it flush too early; it detects that and says so).

The engine interface (`RolloutEngine`) is what `engine=hf` and `engine=vllm` implement.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from gridrun.arch import families
from gridrun.seam.errors import UserError
from gridrun.seam.runconfig import ModelSpec
from gridrun.tasks.base import Messages
from gridrun.train.episode import Episode, Turn
from gridrun.train.seeds import request_seed

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
    # Sampling seed (engines with seeds_requests; None: the engine draws one).
    seed: int | None = None


@dataclass
class Completion:
    token_ids: list[int]
    # Per-token log-probs of token_ids under softmax(logits / temperature) (raw logits if greedy).
    logprobs: list[float]
    text: str
    finish_reason: str


class AdapterNotServed(UserError, RuntimeError):
    """The rollout engine does not serve a role the adapter the trainer holds (one line)."""


class RolloutEngine(ABC):
    """Generates completions for a batch of tokenized prompts, each on its own adapter."""

    # Serves requests as they come (add/step/abort below): rollouts run continuous.
    continuous: bool = False
    # Samples each request from its own seed (GenRequest.seed): rollouts hand every request one.
    seeds_requests: bool = False

    @abstractmethod
    def generate(self, requests: Sequence[GenRequest], sampling: SamplingParams) -> list[Completion]: ...

    def add(self, key: int, request: GenRequest, sampling: SamplingParams) -> None:
        """Continuous engines: start serving `request` (returned by a later step() under `key`)."""
        raise NotImplementedError(f"{type(self).__name__} does not serve requests continuously")

    def step(self) -> list[tuple[int, Completion]]:
        """Continuous engines: one engine step over every request added and not yet returned;
        the (key, completion) of those that finished in it."""
        raise NotImplementedError(f"{type(self).__name__} does not serve requests continuously")

    def abort(self) -> None:
        """Continuous engines: drop every request added and not yet returned."""

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

    def wake(self) -> None:
        """Called after the update, once the trainer has returned its cached GPU memory
        (Trainer.hand_gpu_to_engine): a sleeping engine takes its memory back here, and only
        here."""

    def check_agreement(self, update_metrics: dict[str, float]) -> None:
        """Called after the update with its metrics: engines serving their own copy of the
        weights raise when their rollout log-probs disagree with the trainer's."""

    def close(self) -> None:
        """Release engine resources."""


class ChatEncoder:
    """Applies the chat template and tokenizes prompts, with the model family's conventions
    (gridrun/arch/families.py): its template keyword arguments (enable_thinking for Qwen3
    only, Llama's pinned date), the cell's system prompt and its policy for consecutive
    turns of one role."""

    def __init__(self, tokenizer: Any, enable_thinking: bool, max_prompt_tokens: int, *, name_or_path: str = "toy",
                 system_prompt: str | None = None, template_kwargs: dict[str, Any] | None = None,
                 message_policy: str = "keep") -> None:
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.template_kwargs = families.template_kwargs(name_or_path, enable_thinking, dict(template_kwargs or {}))
        self.system_prompt = system_prompt
        self.message_policy = message_policy

    @classmethod
    def for_model(cls, tokenizer: Any, spec: ModelSpec, max_prompt_tokens: int) -> ChatEncoder:
        return cls(tokenizer, spec.enable_thinking, max_prompt_tokens, name_or_path=spec.name_or_path,
                   system_prompt=spec.system_prompt, template_kwargs=spec.template_kwargs,
                   message_policy=spec.message_policy)

    def encode(self, messages_list: Sequence[Messages]) -> list[list[int]]:
        texts = [
            self.tokenizer.apply_chat_template(
                families.prepare_messages(messages, self.system_prompt, self.message_policy),
                tokenize=False, add_generation_prompt=True, **self.template_kwargs,
            )
            for messages in messages_list
        ]
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]


@dataclass(eq=False)
class _Pending:
    episode: Episode
    seq: int
    seed: int | None
    role: str
    slot: int
    round: int
    messages: Messages
    future: asyncio.Future[Turn]


class WorkflowMisuse(RuntimeError):
    pass


class EpisodeLLM:
    """The `llm` a workflow program sees: records every turn into its episode."""

    def __init__(self, batcher: StageBatcher, episode: Episode, index: int) -> None:
        self._batcher = batcher
        self.episode = episode
        self._index = index
        self._seq = 0
        # The call index of each turn in episode.turns.
        self._turn_seqs: list[int] = []

    async def chat(self, role: str, messages: Messages, *, slot: int = 0, round: int = 0) -> Turn:
        self._seq += 1
        seq = self._seq
        future: asyncio.Future[Turn] = asyncio.get_running_loop().create_future()
        seed = self._batcher._seed(self._index, seq)
        self._batcher._submit(_Pending(self.episode, seq, seed, role, slot, round, messages, future))
        turn = await future
        # Turns in call order, whatever order concurrent calls finish in.
        at = bisect.bisect(self._turn_seqs, seq)
        self._turn_seqs.insert(at, seq)
        self.episode.turns.insert(at, turn)
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
    # The whole continuous rollout (no stages): every request, from first call to last answer.
    continuous: bool = False


class StageBatcher:
    """Serves the LLM calls of a rollout's episodes: staged, or continuous where the engine can
    (`continuous=None`: the engine's `continuous`)."""

    def __init__(
        self,
        engine: RolloutEngine,
        encoder: ChatEncoder,
        route: Callable[[str], str | None],
        sampling: SamplingParams,
        continuous: bool | None = None,
    ) -> None:
        self.engine = engine
        self.encoder = encoder
        self.route = route
        self.sampling = sampling
        self.continuous = engine.continuous if continuous is None else continuous
        if self.continuous and not engine.continuous:
            raise ValueError(f"{type(engine).__name__} cannot serve a continuous rollout: it serves stages only")
        # Calls made and not yet answered (staged: queued for the next flush).
        self._pending: list[_Pending] = []
        self._active = 0
        self._sequential = False
        self._rollout_seed = 0
        # Continuous: the requests the engine is serving, by key, and what wakes the driver.
        self._serving: dict[int, tuple[_Pending, list[int]]] = {}
        self._next_key = 0
        self._wakeup: asyncio.Event | None = None
        self._failed: BaseException | None = None
        self.batches: list[int] = []
        # Each engine call of the run, in order: what `gridrun canary` reports per stage (a
        # continuous rollout is one stage: every request, the rollout's seconds and tokens).
        self.stages: list[StageCost] = []

    def run(self, episodes: Sequence[Episode], program: WorkflowProgram, sequential: bool = False) -> None:
        """Run `program` on every episode. sequential=True runs one episode and one call at a
        time (the unbatched baseline the benchmark compares against)."""
        self._sequential = sequential
        if sequential and self.continuous:
            raise ValueError("a sequential rollout is staged: pass continuous=False")
        # One draw per rollout, and only for engines that seed requests: engine=hf's stream is untouched.
        if self.engine.seeds_requests:
            self._rollout_seed = int(torch.randint(0, 2**62, (1,)))
        if sequential:
            for index, episode in enumerate(episodes):
                asyncio.run(self._run_all([episode], program, index))
        elif self.continuous:
            started = time.perf_counter()
            asyncio.run(self._run_all(list(episodes), program))
            tokens = sum(len(t.completion_ids) for e in episodes for t in e.turns)
            requests = sum(1 for e in episodes for t in e.turns if t.finish_reason != "prompt_too_long")
            self.batches.append(requests)
            self.stages.append(StageCost(requests, time.perf_counter() - started, tokens, continuous=True))
        else:
            asyncio.run(self._run_all(list(episodes), program))

    def _seed(self, episode: int, call: int) -> int | None:
        return request_seed(self._rollout_seed, episode, call) if self.engine.seeds_requests else None

    async def _run_all(self, episodes: list[Episode], program: WorkflowProgram, first: int = 0) -> None:
        self._pending, self._active = [], len(episodes)

        async def one(index: int, episode: Episode) -> None:
            try:
                await program(EpisodeLLM(self, episode, index), episode)
            finally:
                self._active -= 1
                self._maybe_flush()

        if not self.continuous:
            await asyncio.gather(*(one(first + i, e) for i, e in enumerate(episodes)))
            return
        self._wakeup, self._failed = asyncio.Event(), None
        driver = asyncio.create_task(self._drive())
        try:
            await asyncio.gather(*(one(first + i, e) for i, e in enumerate(episodes)))
        finally:
            driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await driver
            if self._serving or self._failed is not None:
                # An episode or a step failed: what the engine still serves belongs to no one.
                self._serving.clear()
                self.engine.abort()

    def _submit(self, pending: _Pending) -> None:
        self._pending.append(pending)
        if len(self._pending) > self._active:
            raise WorkflowMisuse(
                "more pending LLM calls than threads of control: run concurrent calls with "
                "`await llm.parallel(...)`, not asyncio.gather or create_task"
            )
        if self.continuous:
            self._send(pending)
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if self.continuous:
            # Every live thread of control waits on the engine: time for its next step.
            if self._wakeup is not None and len(self._pending) == self._active:
                self._wakeup.set()
        elif self._pending and len(self._pending) == self._active:
            asyncio.get_running_loop().call_soon(self._flush)

    # --- continuous ---------------------------------------------------------------------------
    def _send(self, pending: _Pending) -> None:
        """Hand one call to the engine now (a prompt over the limit is answered at once)."""
        (prompt_ids,) = self.encoder.encode([pending.messages])
        if self._failed is not None:
            self._answer(pending, prompt_ids, None, self._failed)
        elif len(prompt_ids) > self.encoder.max_prompt_tokens:
            self._answer(pending, prompt_ids, Completion([], [], "", "prompt_too_long"))
        else:
            key, self._next_key = self._next_key, self._next_key + 1
            self._serving[key] = (pending, prompt_ids)
            self.engine.add(key, GenRequest(prompt_ids, self.route(pending.role), pending.seed), self.sampling)

    async def _drive(self) -> None:
        """Step the engine, answering each call as its request finishes. Between steps the
        answered episodes run on: the next step waits until each live thread of control has
        made its next call (or ended), so that call joins that step's batch."""
        assert self._wakeup is not None
        while True:
            if not self._serving or len(self._pending) < self._active:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            try:
                finished = self.engine.step()
            except BaseException as err:  # noqa: BLE001 - handed to every waiting episode
                self._failed = err
                for pending, prompt_ids in self._serving.values():
                    self._answer(pending, prompt_ids, None, err)
                self._serving.clear()
                continue
            for key, completion in finished:
                pending, prompt_ids = self._serving.pop(key)
                self._answer(pending, prompt_ids, completion)

    def _answer(self, pending: _Pending, prompt_ids: list[int], done: Completion | None,
                error: BaseException | None = None) -> None:
        self._pending.remove(pending)
        if error is not None:
            pending.future.set_exception(error)
        else:
            assert done is not None
            pending.future.set_result(_turn(pending, prompt_ids, done))

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
        requests = [GenRequest(prompt_ids[i], self.route(chunk[i].role), chunk[i].seed) for i in fits]
        self.batches.append(len(requests))
        started = time.perf_counter()
        completions = self.engine.generate(requests, self.sampling) if requests else []
        tokens = sum(len(c.token_ids) for c in completions)
        self.stages.append(StageCost(len(requests), time.perf_counter() - started, tokens))
        served = dict(zip(fits, completions))
        for i, p in enumerate(chunk):
            p.future.set_result(_turn(p, prompt_ids[i], served.get(i) or Completion([], [], "", "prompt_too_long")))


def _turn(pending: _Pending, prompt_ids: list[int], done: Completion) -> Turn:
    return Turn(
        role=pending.role,
        slot=pending.slot,
        round=pending.round,
        messages=pending.messages,
        prompt_ids=prompt_ids,
        completion_ids=done.token_ids,
        logprobs=done.logprobs,
        text=done.text,
        finish_reason=done.finish_reason,
    )
