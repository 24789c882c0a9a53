"""Test doubles: a scripted `llm` for workflow programs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from gridrun.seam.runconfig import ProtocolSpec
from gridrun.tasks.base import Messages
from gridrun.train.episode import Episode, Turn

Reply = Callable[[str, int, int, Messages], str]


class ScriptedLLM:
    """Answers each call with reply(role, slot, round, messages); records turns like EpisodeLLM."""

    def __init__(self, episode: Episode, reply: Reply) -> None:
        self.episode = episode
        self.reply = reply
        self.calls: list[tuple[str, int, int]] = []

    async def chat(self, role: str, messages: Messages, *, slot: int = 0, round: int = 0) -> Turn:
        self.calls.append((role, slot, round))
        text = self.reply(role, slot, round, messages)
        turn = Turn(role, slot, round, messages, [1], [2, 3], [-0.5, -0.1], text, "stop")
        self.episode.turns.append(turn)
        return turn

    async def parallel(self, *calls: Awaitable[Any]) -> list[Any]:
        return list(await asyncio.gather(*calls))


def run_scripted(
    workflow: Any, task: Any, spec: Any, episode: Episode, reply: Reply, protocol: ProtocolSpec | None = None
) -> ScriptedLLM:
    """Run the workflow on a scripted llm under `protocol` (the schema's defaults: released)."""
    llm = ScriptedLLM(episode, reply)
    asyncio.run(workflow.run(llm, episode, task, spec, protocol or ProtocolSpec()))
    return llm
