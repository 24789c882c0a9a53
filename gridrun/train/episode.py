"""What one workflow rollout records: every turn of every role, and the committed answer."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gridrun.tasks.base import Messages, Problem, Score


@dataclass
class Turn:
    role: str
    # Index among same-role slots (the 3 voters, the 3 workers); 0 otherwise.
    slot: int
    # Eval-Opt round (0 = first answer); 0 for other workflows.
    round: int
    messages: Messages
    prompt_ids: list[int]
    completion_ids: list[int]
    # Log-probs of completion_ids under the rollout policy (temperature-scaled logits).
    logprobs: list[float]
    text: str
    # "stop" (end-of-turn token), "length" (hit the response cap) or "prompt_too_long".
    finish_reason: str
    # The role's own parsed output: an answer, a verdict, a selection, strategies.
    parsed: Any = None


@dataclass
class Episode:
    problem: Problem
    # Position in its group of n rollouts of the same problem.
    sample: int
    turns: list[Turn] = field(default_factory=list)
    # The response text whose answer the workflow commits to (None: it committed to none).
    final_response: str | None = None
    score: Score | None = None
    # Workflow-specific facts (selected candidate, verdicts, strategies), for diagnostics.
    info: dict[str, Any] = field(default_factory=dict)
    # The reward-control cell's training reward: another episode's reward of the same step
    # (None: the episode's own score trains it).
    shuffled_reward: float | None = None
    # Each turn's own training reward, parallel to `turns` (reward.credit=per_role; None: the
    # episode's reward trains every turn, as the paper's broadcast).
    turn_rewards: list[float] | None = None

    @property
    def scored(self) -> Score:
        """Its score, read after the task scored it (the trainer scores every episode it rolls out)."""
        assert self.score is not None, "an episode is read before it is scored"
        return self.score

    @property
    def reward(self) -> float:
        """What GRPO trains on: the score's reward, or the control's permuted one."""
        if self.shuffled_reward is not None:
            return self.shuffled_reward
        assert self.score is not None, "episode not scored yet"
        return self.score.reward

    def rewards_of_turns(self) -> list[float]:
        """What GRPO trains each turn on: its own reward where credit gave one, else the episode's."""
        if self.turn_rewards is not None:
            return self.turn_rewards
        return [self.reward] * len(self.turns)

    def role_turns(self, role: str) -> list[Turn]:
        return [t for t in self.turns if t.role == role]

    def to_json(self) -> dict[str, Any]:
        """Every turn's text, for samples/step_XXXXXX.jsonl (token ids left out)."""
        return {
            "problem_id": self.problem.id,
            "question": self.problem.question,
            "answer": self.problem.answer,
            "sample": self.sample,
            "final_response": self.final_response,
            "score": asdict(self.score) if self.score else None,
            "info": self.info,
            "turns": [
                {
                    "role": t.role,
                    "slot": t.slot,
                    "round": t.round,
                    "messages": t.messages,
                    "text": t.text,
                    "finish_reason": t.finish_reason,
                    "parsed": t.parsed,
                    "n_tokens": len(t.completion_ids),
                }
                for t in self.turns
            ],
        }
