"""Plan-time checks of a cell's conversations against its model, so that what a job would
die on is refused before anything is queued, in one line naming the fix.

- **Context window**: one call's prompt plus response limit (`lengths.*`, the workflow x task
  row) against the model's `max_position_embeddings` (gridrun/arch/): Eval-Opt math's 30,720
  + 5,120 = 35,840 tokens exceed Qwen2.5's and Gemma-3-1B's 32,768, and SmolLM2's 8,192 holds
  none of the paper's math rows.
- **Conversation shapes**: each workflow's conversations, collected by running its program
  (the registry's `run`, torch-free) on a placeholder problem with a recording stand-in for
  the model that always answers "\\boxed{Incorrect}" (so Eval-Opt runs every round), then
  prepared as the trainer prepares them (system prompt, `model.message_policy`:
  gridrun/arch/families.py). A family whose template requires alternating roles (Gemma 3)
  is checked without any files.
- **The fetched template**: once the model's files are on this machine (`gridrun fetch`), each
  conversation is rendered through the checkpoint's own chat template (chat_template.jinja or
  tokenizer_config.json's `chat_template`) in a sandboxed Jinja environment like
  transformers' own: a template that raises is refused here, not in a job, and a template
  whose prompt changes with today's date (`strftime_now`, Llama 3.x without a pinned
  `date_string`) is refused too: a resumed run or an evaluation cell would see other prompts.

Torch-free (jinja2 only, the templates' own language).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gridrun import modelfiles
from gridrun.arch import UnknownArchitecture, context_window, families, published
from gridrun.grid.errors import GridError
from gridrun.seam import registry
from gridrun.seam.runconfig import RunConfig

# The stand-in model's every answer: a rejected verdict keeps Eval-Opt revising to its last round.
PLACEHOLDER_REPLY = "\\boxed{Incorrect}"
PLACEHOLDER_QUESTION = "What is 1 + 1?"
# Two dates a date-dependent template renders differently.
_DATES = ("01 Jan 2025", "02 Feb 2026")


@dataclass(frozen=True)
class Call:
    """One LLM call of a workflow: the role that makes it and the messages it sends."""

    role: str
    messages: tuple[tuple[tuple[str, str], ...], ...]

    def as_messages(self) -> list[dict[str, str]]:
        return [dict(m) for m in self.messages]

    def shape(self) -> str:
        return " -> ".join(dict(m)["role"] for m in self.messages)


class _Recorder:
    """The `llm` a workflow program sees: records each call, answers the placeholder."""

    def __init__(self) -> None:
        self.calls: list[Call] = []

    async def chat(self, role: str, messages: Sequence[dict[str, str]], *, slot: int = 0, round: int = 0) -> Any:
        self.calls.append(Call(role, tuple(tuple(sorted(m.items())) for m in messages)))
        return SimpleNamespace(text=PLACEHOLDER_REPLY, parsed=None, round=round, role=role)

    async def parallel(self, *calls: Any) -> list[Any]:
        return list(await asyncio.gather(*calls))


_CALLS: dict[str, tuple[Call, ...]] = {}


def workflow_calls(config: RunConfig) -> tuple[Call, ...]:
    """Every distinct LLM call (role and message shape) of the cell's workflow on its task."""
    key = repr((config.workflow, config.task.name, config.task.plugin, config.protocol))
    if key not in _CALLS:
        entry = registry.workflow(config.workflow.name, config.workflow.plugin)
        task_entry = registry.task(config.task.name, config.task.plugin)
        prompts = task_entry.prompts()
        prompts.add(registry.extra_prompts(config.task.name))
        task = SimpleNamespace(prompts=prompts, extract_answer=lambda text: None)
        episode = SimpleNamespace(problem=SimpleNamespace(question=PLACEHOLDER_QUESTION), final_response=None, info={})
        recorder = _Recorder()
        asyncio.run(entry.run(recorder, episode, task, config.workflow, config.protocol))
        shapes: dict[tuple[str, str], Call] = {}
        for call in recorder.calls:
            shapes.setdefault((call.role, call.shape()), call)
        _CALLS[key] = tuple(shapes.values())
    return _CALLS[key]


def prepared(config: RunConfig, call: Call) -> list[dict[str, str]]:
    """A call's messages as the trainer hands them to the template (gridrun/train/rollout.py)."""
    return families.prepare_messages(call.as_messages(), config.model.system_prompt, config.model.message_policy)


def context_problem(config: RunConfig) -> str | None:
    """A call whose prompt and response limits exceed the model's context window."""
    try:
        window = context_window(published(config.model.name_or_path))
    except UnknownArchitecture:
        return None
    lengths = config.lengths
    needed = lengths.max_prompt_tokens + lengths.max_response_tokens
    if needed <= window:
        return None
    return (f"{config.workflow.name} on {config.task.name} needs {lengths.max_prompt_tokens} + "
            f"{lengths.max_response_tokens} = {needed} tokens per call, more than {config.model.name_or_path}'s "
            f"context window of {window} (max_position_embeddings): lower lengths.max_prompt_tokens to at most "
            f"{window - lengths.max_response_tokens}, or pick a scale= with a longer context")


def _policy_fix(config: RunConfig) -> str:
    others = [p for p in families.MESSAGE_POLICIES if p != config.model.message_policy and p != "keep"]
    return f"set model.message_policy={' or '.join(others)} (now {config.model.message_policy})"


def alternation_problem(config: RunConfig) -> str | None:
    """A call the model's family template would refuse for consecutive turns of one role."""
    fam = families.family_of(config.model.name_or_path)
    if fam is None or not fam.alternating_roles:
        return None
    for call in workflow_calls(config):
        why = families.alternation_problem(prepared(config, call))
        if why:
            return (f"{config.model.name_or_path}'s chat template requires alternating user/assistant turns, and "
                    f"{config.workflow.name}'s {call.role} call breaks it ({why}): {_policy_fix(config)}")
    return None


def template_source(folder: Path) -> tuple[str, dict[str, str]] | None:
    """(the chat template, the tokenizer's special tokens by name) of a checkpoint folder;
    None when it ships no template."""
    try:
        tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    template = tokenizer_config.get("chat_template")
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        template = jinja.read_text()
    elif isinstance(template, list):
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    if not isinstance(template, str):
        return None
    special = {}
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        value = tokenizer_config.get(name)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            special[name] = value
    return template, special


def render(template: str, messages: list[dict[str, str]], special: dict[str, str], kwargs: dict[str, Any],
           today: str = _DATES[0]) -> str:
    """The prompt text `template` makes of `messages`, as transformers' apply_chat_template
    renders it (a sandboxed environment, trim_blocks and lstrip_blocks, raise_exception,
    strftime_now answering `today`); raises jinja2's TemplateError where the template does."""
    from datetime import datetime

    from jinja2.exceptions import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.strptime(today, "%d %b %Y").strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    return env.from_string(template).render(messages=messages, add_generation_prompt=True, **special, **kwargs)


def fetched_template_problem(config: RunConfig, folder: Path) -> str | None:
    """Why the checkpoint's own template cannot render the cell's conversations, or makes
    a prompt that depends on today's date; None when every call renders, the same any day."""
    from jinja2.exceptions import TemplateError

    source = template_source(folder)
    if source is None:
        return None
    template, special = source
    model = config.model
    kwargs = families.template_kwargs(model.name_or_path, model.enable_thinking, dict(model.template_kwargs))
    name = f"{model.name_or_path}'s chat template ({folder})"
    for call in workflow_calls(config):
        messages = prepared(config, call)
        try:
            first, second = (render(template, messages, special, kwargs, today) for today in _DATES)
        except (TemplateError, TypeError, ValueError, KeyError, AttributeError) as err:
            shape = " -> ".join(m["role"] for m in messages)
            fix = (_policy_fix(config) if families.alternation_problem(messages)
                   else "fix the template or pick another scale=")
            return (f"{name} cannot render {config.workflow.name}'s {call.role} call ({shape}): "
                    f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}: {fix}")
        if first != second:
            return (f"{name} writes today's date into {config.workflow.name}'s {call.role} prompt, so a resumed run "
                    "or an evaluation cell would see another prompt: pin it with model.template_kwargs.date_string")
    return None


def check_fetched_templates(cells: Sequence[Any], model_dirs: dict[str, str],
                            folder_of: Callable[[str, dict[str, str]], Path | None] | None = None) -> None:
    """Refuse (GridError, one line) the first planned cell whose fetched model's template cannot
    render its conversations; cells whose model is not fetched (or random-init) are left to
    the alternation check and `gridrun fetch`."""
    folder_of = folder_of or model_folder
    seen: set[str] = set()
    for pc in cells:
        config = pc.config
        if config.model.init == "random" or config.model.name_or_path == "toy":
            continue
        key = repr((config.model, config.workflow, config.task.name, config.protocol))
        if key in seen:
            continue
        seen.add(key)
        folder = folder_of(config.model.name_or_path, model_dirs)
        why = fetched_template_problem(config, folder) if folder is not None else None
        if why:
            raise GridError(f"cell {pc.id}: {why}")


def model_folder(name_or_path: str, model_dirs: dict[str, str]) -> Path | None:
    """The fetched checkpoint folder of a model on this machine, or None when it is not here."""
    if modelfiles.missing_model(name_or_path, model_dirs) is not None:
        return None
    if name_or_path in model_dirs:
        return Path(model_dirs[name_or_path]).expanduser()
    if not modelfiles.is_hub_id(name_or_path):
        return Path(name_or_path).expanduser()
    return modelfiles.cached_snapshot(name_or_path)
