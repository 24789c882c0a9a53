"""`single`: one generator answers; the single-agent RL control and the SA-RL baseline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gridrun.seam.registry import Workflow, WorkflowParams, register_workflow
from gridrun.seam.runconfig import ProtocolSpec


@dataclass
class SingleParams(WorkflowParams):
    name: str = "single"


async def run(llm: Any, episode: Any, task: Any, params: SingleParams, protocol: ProtocolSpec) -> None:
    turn = await llm.chat("generator", task.prompts["generator"](episode.problem.question))
    turn.parsed = task.extract_answer(turn.text)
    episode.final_response = turn.text


WORKFLOW = register_workflow(
    Workflow(name="single", roles=("generator",), params=SingleParams, run=run, answer_roles=("generator",),
             single_agent=True)
)
