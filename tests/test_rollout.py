"""Stage batching and the hf engine."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
import torch

from gridrun.seam.registry import workflow as get_workflow
from gridrun.seam.runconfig import ProtocolSpec
from gridrun.tasks.arith import ArithTask
from gridrun.train.episode import Episode
from gridrun.train.rollout import (
    ChatEncoder,
    Completion,
    GenRequest,
    RolloutEngine,
    SamplingParams,
    StageBatcher,
    WorkflowMisuse,
)

TASK = ArithTask(n_train=50, n_val=10)
SAMPLING = SamplingParams(temperature=0.7, max_new_tokens=32)


class CountingEngine(RolloutEngine):
    """Answers '\\boxed{1}' to everything and records the size and adapters of each batch."""

    def __init__(self) -> None:
        self.batches: list[list[str | None]] = []

    def generate(self, requests: Sequence[GenRequest], sampling: SamplingParams) -> list[Completion]:
        self.batches.append([r.adapter for r in requests])
        return [Completion([5, 6], [-0.1, -0.2], "\\boxed{1}", "stop") for _ in requests]


class WordEncoder(ChatEncoder):
    def __init__(self, max_prompt_tokens: int = 10_000) -> None:
        self.max_prompt_tokens = max_prompt_tokens

    def encode(self, messages_list):  # one token per word
        return [[1] * len(" ".join(m["content"] for m in messages).split()) for messages in messages_list]


def run_workflow(name: str, n_episodes: int, sequential: bool = False, route=lambda role: role, encoder=None,
                 protocol: ProtocolSpec | None = None):
    engine = CountingEngine()
    batcher = StageBatcher(engine, encoder or WordEncoder(), route, SAMPLING)
    workflow = get_workflow(name)
    spec = workflow.params()
    episodes = [Episode(problem=p, sample=0) for p in TASK.train_problems()[:n_episodes]]

    async def program(llm, episode):
        await workflow.run(llm, episode, TASK, spec, protocol or ProtocolSpec())

    batcher.run(episodes, program, sequential=sequential)
    return engine, episodes


def test_voting_is_one_batch_per_stage_routed_by_role() -> None:
    engine, episodes = run_workflow("voting", 8)
    # All 24 voter calls in one batch, then all 8 aggregator calls.
    assert [len(b) for b in engine.batches] == [24, 8]
    assert set(engine.batches[0]) == {"generator"} and set(engine.batches[1]) == {"aggregator"}
    assert all(len(e.turns) == 4 for e in episodes)


def test_orch_workers_stages() -> None:
    # Every plan is "\\boxed{1}": no strategy, so one worker per episode under the released
    # protocol (the whole plan stands in as its strategy), three under fixed.
    engine, _ = run_workflow("orch_workers", 5)
    assert [len(b) for b in engine.batches] == [5, 5, 5]
    engine, _ = run_workflow("orch_workers", 5, protocol=ProtocolSpec(orch_workers="fixed"))
    assert [len(b) for b in engine.batches] == [5, 15, 5]


def test_eval_opt_episodes_that_stop_early_leave_the_batch() -> None:
    # Every verdict is "\\boxed{1}", i.e. malformed: all episodes use the full 3 rounds,
    # 3 generator turns each judged: 6 stages.
    engine, episodes = run_workflow("eval_opt", 4)
    assert [len(b) for b in engine.batches] == [4] * 6
    assert all(len(e.turns) == 6 for e in episodes)


def test_sequential_baseline_serves_one_call_at_a_time() -> None:
    engine, _episodes = run_workflow("voting", 3, sequential=True)
    assert [len(b) for b in engine.batches] == [1] * 12


def test_prompt_over_the_cap_is_not_generated() -> None:
    engine, episodes = run_workflow("single", 2, encoder=WordEncoder(max_prompt_tokens=1))
    assert engine.batches == []
    assert all(e.turns[0].finish_reason == "prompt_too_long" and e.turns[0].completion_ids == [] for e in episodes)


def test_asyncio_gather_inside_a_workflow_is_refused() -> None:
    batcher = StageBatcher(CountingEngine(), WordEncoder(), lambda r: None, SAMPLING)

    async def program(llm, episode):
        await asyncio.gather(llm.chat("generator", [{"role": "user", "content": "a"}]),
                             llm.chat("generator", [{"role": "user", "content": "b"}]))

    with pytest.raises(WorkflowMisuse, match="llm.parallel"):
        batcher.run([Episode(problem=TASK.train_problems()[0], sample=0)], program)


def test_hf_logprobs_match_a_teacher_forced_forward(toy_model) -> None:
    from gridrun.train.engines.hf import HFEngine

    model, tokenizer = toy_model
    encoder = ChatEncoder(tokenizer, enable_thinking=False, max_prompt_tokens=256)
    prompts = encoder.encode([TASK.prompts.generator(p.question) for p in TASK.val_problems()[:6]])
    torch.manual_seed(0)
    outs = HFEngine(model, tokenizer).generate([GenRequest(p, None) for p in prompts], SAMPLING)
    for prompt, out in zip(prompts, outs):
        ids = torch.tensor([prompt + out.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / SAMPLING.temperature
        expected = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(out.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-4)
        assert out.finish_reason == "stop" and out.token_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_hf_greedy_batch_equals_one_at_a_time(toy_model) -> None:
    from gridrun.train.engines.hf import HFEngine

    model, tokenizer = toy_model
    engine = HFEngine(model, tokenizer)
    encoder = ChatEncoder(tokenizer, enable_thinking=False, max_prompt_tokens=256)
    # Different prompt lengths, so left padding is exercised.
    messages = [TASK.prompts.generator("12 + 34"), TASK.prompts.aggregator("12 + 34", ["\\boxed{46}", "\\boxed{45}"])]
    prompts = encoder.encode(messages)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24)
    batched = engine.generate([GenRequest(p, None) for p in prompts], greedy)
    alone = [engine.generate([GenRequest(p, None)], greedy)[0] for p in prompts]
    assert [b.token_ids for b in batched] == [a.token_ids for a in alone]


def test_hf_shared_prefill_draws_the_same_tokens_as_the_full_prefill(toy_model) -> None:
    """A repeated prompt's prefill runs once and its cache is copied to its rows; generate
    then runs only the prompts' last column (transformers' generate here: the lean Qwen3 loop
    takes the same cache, tests/test_qwen3_decode.py). Sampling draws from torch's RNG in the same
    order over the same rows, and the logits differ from the full prefill's only by float
    rounding (other matrix shapes), so the same seed draws the same tokens unless a uniform
    draw falls within ~1e-6 of a boundary of the cumulative distribution."""
    from gridrun.train.engines.hf import HFEngine

    model, tokenizer = toy_model
    gen = torch.Generator().manual_seed(0)
    a, b, c = (torch.randint(5, len(tokenizer), (n,), generator=gen).tolist() for n in (9, 14, 5))
    # 12 rows on 3 prompts, interleaved: rows need not be grouped by prompt.
    requests = [GenRequest(p, None) for p in (a, b, a, c, b, a, c, a, b, c, b, c)]
    sampling = SamplingParams(temperature=0.7, max_new_tokens=8)
    seen: list[int] = []
    hook = model.model.embed_tokens.register_forward_hook(lambda module, args, out: seen.append(args[0].numel()))
    runs: dict[bool, list[list[Completion]]] = {}
    first_tokens: dict[bool, list[int]] = {}
    try:
        for shared in (False, True):
            engine = HFEngine(model, tokenizer, share_prefill=shared, lean_decode=False)
            seen.clear()
            runs[shared] = []
            for seed in range(3):
                torch.manual_seed(seed)
                runs[shared].append(engine.generate(requests, sampling))
            first_tokens[shared] = seen[:2]
    finally:
        hook.remove()
    # Full prefill: 12 rows x 14 columns (the longest prompt) = 168 tokens, then 1 per row.
    # Shared: 3 prompts x 13 columns (all but the last) = 39, then the last column of 12 rows.
    assert first_tokens == {False: [168, 12], True: [39, 12]}
    for full, shared in zip(runs[False], runs[True]):
        assert [o.token_ids for o in shared] == [o.token_ids for o in full]
        for one, other in zip(shared, full):
            torch.testing.assert_close(torch.tensor(one.logprobs), torch.tensor(other.logprobs), rtol=0, atol=1e-5)
    # Rows of one prompt drew different continuations: the copies are independent samples (on
    # these random-token prompts the shipped world mostly ends its turn at once, so any prompt
    # and seed will do).
    rows = {tuple(r.prompt_ids): [i for i, q in enumerate(requests) if q.prompt_ids == r.prompt_ids] for r in requests}
    assert any(len({tuple(run[i].token_ids) for i in same}) > 1 for run in runs[True] for same in rows.values())


def test_hf_merged_adapter_samples_the_trained_policy_and_leaves_the_base_untouched(toy_world) -> None:
    """With float32 weights the engine serves an adapter merged into copies of the base
    weights: the update must find the very same base tensors afterwards, and the rollout
    log-probs must be the unmerged policy's up to float rounding."""
    from peft import LoraConfig, get_peft_model

    from gridrun.seam.runconfig import ModelSpec, ToySpec
    from gridrun.train.engines.hf import HFEngine
    from gridrun.train.model import load_base

    base, tokenizer = load_base(ModelSpec(name_or_path="toy", toy=ToySpec()), str(toy_world))  # its own copy: peft rewrites the modules it wraps
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"), adapter_name="gen")
    torch.manual_seed(0)
    for name, param in model.named_parameters():
        if "lora_B" in name:  # peft starts B at 0 (a no-op adapter): give it a real delta
            param.data.normal_(0.0, 0.05)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    identity = {n: p.data.data_ptr() for n, p in model.named_parameters() if "lora_" not in n}
    merged, plain = HFEngine(model, tokenizer), HFEngine(model, tokenizer, merge_lora=False)
    assert merged.merge_lora and not plain.merge_lora
    encoder = ChatEncoder(tokenizer, enable_thinking=False, max_prompt_tokens=256)
    prompts = encoder.encode([TASK.prompts.generator(p.question) for p in TASK.val_problems()[:4]])

    torch.manual_seed(1)
    outs = merged.generate([GenRequest(p, "gen") for p in prompts], SAMPLING)
    after = dict(model.named_parameters())
    assert all(torch.equal(after[n], w) and after[n].data.data_ptr() == identity[n] for n, w in before.items())
    assert not any(getattr(m, "merged_adapters", []) for m in model.modules())
    off_base = 0.0
    for prompt, out in zip(prompts, outs):
        ids = torch.tensor([prompt + out.token_ids])
        with torch.no_grad():  # the unmerged adapter, as the update computes it, and the base model
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / SAMPLING.temperature
            with model.disable_adapter():
                base_logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / SAMPLING.temperature
        taken = torch.tensor(out.token_ids)[:, None]
        expected = torch.log_softmax(logits, -1).gather(-1, taken).squeeze(-1)
        assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-4)
        unadapted = torch.log_softmax(base_logits, -1).gather(-1, taken).squeeze(-1)
        off_base = max(off_base, float((torch.tensor(out.logprobs) - unadapted).abs().max()))
    # The adapter was served, not the base model: B ~ N(0, 0.05) moves log-probs far beyond rounding.
    assert off_base > 1e-3
    # Greedy decoding agrees merged or not.
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24)
    requests = [GenRequest(p, "gen") for p in prompts]
    assert [o.token_ids for o in merged.generate(requests, greedy)] == [o.token_ids for o in plain.generate(requests, greedy)]


def test_hf_merges_only_float32_weights_that_fit_the_copy_limit(toy_world, monkeypatch) -> None:
    """bf16 would round the LoRA delta into the base weights (sampling another policy), and
    a copy over the limit doubles a large model's memory: neither is merged unasked."""
    from peft import LoraConfig, get_peft_model

    from gridrun.seam.runconfig import ModelSpec, ToySpec
    from gridrun.train.engines import hf
    from gridrun.train.model import load_base
    from gridrun.train.precision import ALLOW_EMULATED

    monkeypatch.setenv(ALLOW_EMULATED, "1")  # a bf16 model is only inspected here, on any CPU
    base, tokenizer = load_base(ModelSpec(name_or_path="toy", dtype="bfloat16", toy=ToySpec()), str(toy_world))
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"), adapter_name="gen")
    assert not hf.HFEngine(model, tokenizer).merge_lora
    base, tokenizer = load_base(ModelSpec(name_or_path="toy", toy=ToySpec()), str(toy_world))
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"), adapter_name="gen")
    assert hf.HFEngine(model, tokenizer).merge_lora
    # The toy's wrapped weights: 4 layers x (q 128x128, k and v 64x128, o 128x128, gate and up
    # 512x128, down 128x512) = 983,040 float32 weights = 3,932,160 bytes; one byte less refuses.
    wrapped = sum(m.get_base_layer().weight.numel() * 4 for m in model.modules() if isinstance(m, hf.LoraLayer))
    assert wrapped == 3_932_160
    monkeypatch.setattr(hf, "MERGE_COPY_LIMIT_BYTES", wrapped)
    assert hf.HFEngine(model, tokenizer).merge_lora
    monkeypatch.setattr(hf, "MERGE_COPY_LIMIT_BYTES", wrapped - 1)
    assert not hf.HFEngine(model, tokenizer).merge_lora


class SeededEngine(RolloutEngine):
    """A continuous engine whose answer to a request is a function of its seed alone, and that
    takes one step per answer token: the evaluator's verdicts and every response's length vary
    with the seed, as sampled ones do."""

    continuous = True
    seeds_requests = True

    def __init__(self, fail_at_step: int | None = None) -> None:
        self.serving: dict[int, tuple[int, Completion]] = {}
        self.steps = 0
        self.aborted = 0
        self.fail_at_step = fail_at_step

    def answer(self, request: GenRequest) -> Completion:
        assert request.seed is not None
        n = 1 + request.seed % 7
        text = ("\\boxed{Correct}" if request.seed % 3 else "\\boxed{Incorrect}") if request.adapter == "evaluator" \
            else f"\\boxed{{{request.seed % 5}}}"
        return Completion(list(range(n)), [-0.5] * n, text, "stop")

    def generate(self, requests: Sequence[GenRequest], sampling: SamplingParams) -> list[Completion]:
        self.steps += max(len(self.answer(r).token_ids) for r in requests)
        return [self.answer(r) for r in requests]

    def add(self, key: int, request: GenRequest, sampling: SamplingParams) -> None:
        done = self.answer(request)
        self.serving[key] = (len(done.token_ids), done)

    def step(self) -> list[tuple[int, Completion]]:
        self.steps += 1
        if self.steps == self.fail_at_step:
            raise RuntimeError("engine died")
        self.serving = {k: (left - 1, done) for k, (left, done) in self.serving.items()}
        finished = [(k, done) for k, (left, done) in self.serving.items() if left == 0]
        for k, _ in finished:
            del self.serving[k]
        return finished

    def abort(self) -> None:
        self.aborted += len(self.serving)
        self.serving.clear()


def seeded_rollout(name: str, continuous: bool, engine: SeededEngine | None = None) -> tuple[SeededEngine, list[Episode]]:
    engine = engine or SeededEngine()
    workflow = get_workflow(name)
    spec = workflow.params()
    episodes = [Episode(problem=p, sample=k) for p in TASK.train_problems()[:6] for k in range(2)]

    async def program(llm, episode):
        await workflow.run(llm, episode, TASK, spec, ProtocolSpec())

    torch.manual_seed(0)
    StageBatcher(engine, WordEncoder(), lambda role: role, SAMPLING, continuous=continuous).run(episodes, program)
    return engine, episodes


@pytest.mark.parametrize("name", ["eval_opt", "voting", "orch_workers"])
def test_continuous_rollout_gives_the_staged_episodes_in_fewer_engine_steps(name: str) -> None:
    staged_engine, staged = seeded_rollout(name, continuous=False)
    engine, continuous = seeded_rollout(name, continuous=True)
    assert continuous == staged
    # Turns in call order (concurrent slots finish in any order in a continuous rollout).
    for episode in continuous:
        slots = [t.slot for t in episode.turns if t.role in ("generator", "worker") and name != "eval_opt"]
        assert slots == sorted(slots)
    # An episode waits only for its own calls, never for another's longest response: with two
    # stages (voting, orch_workers' three) the longest chain is often the sum of the maxima; with
    # revision rounds taken by some episodes only, it never is.
    assert engine.steps <= staged_engine.steps
    if name == "eval_opt":
        assert len({len(e.turns) for e in staged}) > 1, "episodes revise a different number of rounds"
        assert engine.steps < staged_engine.steps
    # Another rollout seed (torch's RNG) samples other episodes.
    torch.manual_seed(1)
    other = [Episode(problem=p, sample=k) for p in TASK.train_problems()[:6] for k in range(2)]
    workflow = get_workflow(name)

    async def program(llm, episode):
        await workflow.run(llm, episode, TASK, workflow.params(), ProtocolSpec())

    StageBatcher(SeededEngine(), WordEncoder(), lambda role: role, SAMPLING).run(other, program)
    assert other != continuous


def test_a_failing_engine_step_fails_the_rollout_and_drops_what_it_served() -> None:
    engine = SeededEngine(fail_at_step=3)
    with pytest.raises(RuntimeError, match="engine died"):
        seeded_rollout("voting", continuous=True, engine=engine)
    assert engine.serving == {} and engine.aborted > 0


def test_engines_without_continuous_serving_refuse_a_continuous_rollout() -> None:
    with pytest.raises(ValueError, match="serves stages only"):
        StageBatcher(CountingEngine(), WordEncoder(), lambda r: None, SAMPLING, continuous=True)
