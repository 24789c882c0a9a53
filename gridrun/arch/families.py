"""What differs between model families, handled here once: the chat conventions a cell's
config names and both halves apply.

- **Stop ids**: the union of the tokenizer's eos and generation_config.json's `eos_token_id`
  (Gemma 3's tokenizer names `<eos>`, its generation_config adds `<end_of_turn>`; Phi-4-mini's
  adds `<|end|>`), as vLLM reads them.
- **Template keyword arguments**: `enable_thinking` reaches Qwen3's template only; Llama 3.2's
  template writes today's date into every prompt (`strftime_now`) unless `date_string` is
  passed, so a Llama cell pins it (`model.template_kwargs.date_string`), or a resumed run and
  an evaluation cell would see other prompts than the run they continue.
- **System prompt**: Qwen2.5's and SmolLM2's templates write their own when a conversation
  has none; their scale files name that text in `model.system_prompt`, so the prompt a cell
  trains on is in its config, sent as an explicit system turn.
- **Consecutive turns of one role** (`model.message_policy`): Eval-Opt's full context keeps an
  answer and its critique as two assistant turns in a row, which Gemma 3's template refuses
  ("Conversation roles must alternate"). `keep` sends the conversation as the workflow wrote
  it (Qwen3 and every family whose template accepts it); `merge` joins consecutive turns of one
  role into one; `critic_as_user` shows a model turn that follows a model turn (the critique)
  as a user turn, then merges consecutive user turns. The policy is a run key, so it is in
  the cell's config and fingerprint.
- **LoRA scope**: Gemma 3 4B's checkpoint is a vision-language model; its adapters wrap the
  language model's linear layers only (`LANGUAGE_MODEL_LINEAR`, named in its scale file).

Each family also has a turn format for random-init builds (`model.init=random`): the toy
tokenizer mapped into the family's vocabulary speaks it with the family's own special tokens
and ids (gridrun/train/random_init.py), so stop ids, padding and the template's refusals
behave as with the real tokenizer. These formats are gridrun's renderings of each family's
documented chat format, not the hub's template files (`gridrun plan` renders a fetched
model's own template, gridrun/grid/templates.py).

Torch-free and standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gridrun.arch import UnknownArchitecture, family, published

MESSAGE_POLICIES = ("keep", "merge", "critic_as_user")
# peft's target_modules as a full-match pattern: every linear layer of the language model,
# none of a vision tower's (Gemma 3 4B's SigLIP encoder has q/k/v projections too).
LANGUAGE_MODEL_LINEAR = (r"^(?!.*(vision_tower|multi_modal_projector)).*\."
                         r"(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)$")
# Llama 3.2's template's own fallback date where strftime_now is missing.
LLAMA_DATE = "26 Jul 2024"
# Gemma 3's message for roles that do not alternate; the random-init format raises it too.
ALTERNATE_MESSAGE = "Conversation roles must alternate user/assistant/user/assistant/..."
# The system prompts Qwen2.5's and SmolLM2's templates write where a conversation has none.
_QWEN25_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
_SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"



def _chatml(default_system: str) -> str:
    """ChatML with the system prompt the template writes where a conversation has none."""
    return (
        "{%- if messages[0]['role'] != 'system' %}{{- '<|im_start|>system\\n" + default_system + "<|im_end|>\\n' }}"
        "{%- endif %}"
        "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
        "'<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )


_LLAMA = (
    "{{- '<|begin_of_text|>' }}"
    "{%- if date_string is not defined %}{%- if strftime_now is defined %}"
    "{%- set date_string = strftime_now('%d %b %Y') %}{%- else %}{%- set date_string = '" + LLAMA_DATE + "' %}"
    "{%- endif %}{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] %}"
    "{%- set turns = messages[1:] %}{%- else %}{%- set system = '' %}{%- set turns = messages %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\nCutting Knowledge Date: December 2023\\nToday Date: ' "
    "+ date_string + '\\n\\n' + system + '<|eot_id|>' }}"
    "{%- for message in turns %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
    "message['content'] + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
_GEMMA = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set prefix = messages[0]['content'] + '\\n\\n' %}"
    "{%- set turns = messages[1:] %}{%- else %}{%- set prefix = '' %}{%- set turns = messages %}{%- endif %}"
    "{%- for message in turns %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('" + ALTERNATE_MESSAGE + "') }}{%- endif %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{- '<start_of_turn>' + role + '\\n' + (prefix if loop.first else '') + message['content'] + "
    "'<end_of_turn>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)
_PHI = (
    "{%- for message in messages %}{{- '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|assistant|>' }}{%- endif %}"
)


@dataclass(frozen=True)
class Family:
    name: str
    # The paper's family: the one whose template has Qwen3's enable_thinking switch.
    thinking_switch: bool = False
    # Template keyword arguments a cell must pin, each with the value its scale files name.
    pinned: tuple[tuple[str, str], ...] = ()
    # The system prompt the template writes into a conversation that has none.
    template_system_prompt: str | None = None
    # The template raises on two turns of one role in a row.
    alternating_roles: bool = False
    # The message policy the family's scale files name.
    message_policy: str = "keep"
    # The random-init build's turn format (None: the toy world's, Qwen3's).
    turn_format: str | None = None


FAMILIES = {f.name: f for f in (
    # The toy world's format (gridrun/toy/world/chat_template.jinja) is Qwen3's.
    Family("qwen3", thinking_switch=True),
    Family("qwen2.5", template_system_prompt=_QWEN25_SYSTEM, turn_format=_chatml(_QWEN25_SYSTEM)),
    Family("llama3.2", pinned=(("date_string", LLAMA_DATE),), turn_format=_LLAMA),
    Family("gemma3", alternating_roles=True, message_policy="critic_as_user", turn_format=_GEMMA),
    Family("phi4mini", turn_format=_PHI),
    Family("smollm2", template_system_prompt=_SMOLLM2_SYSTEM, turn_format=_chatml(_SMOLLM2_SYSTEM)),
)}


class FamilyError(ValueError):
    pass


def family_of(name_or_path: str) -> Family | None:
    """The family of a model gridrun ships the architecture of (the toy world's is Qwen3's);
    None for any other model, which keeps Qwen3's conventions (enable_thinking passed)."""
    if name_or_path == "toy":
        return FAMILIES["qwen3"]
    try:
        return FAMILIES[family(published(name_or_path))]
    except UnknownArchitecture:
        return None


def check_model(name_or_path: str, enable_thinking: bool, template_kwargs: dict[str, Any]) -> None:
    """Refuse (FamilyError, one line) template settings the model's family does not take."""
    fam = family_of(name_or_path)
    if fam is None:
        return
    if enable_thinking and not fam.thinking_switch:
        raise FamilyError(f"model.enable_thinking is Qwen3's template switch; {name_or_path} ({fam.name}) has none: "
                          "set model.enable_thinking=false")
    if "enable_thinking" in template_kwargs:
        raise FamilyError("model.template_kwargs.enable_thinking: set model.enable_thinking instead")
    for key, value in fam.pinned:
        if key not in template_kwargs:
            raise FamilyError(f"{name_or_path}'s template writes today's date into every prompt unless {key} is "
                              f"pinned: set model.template_kwargs.{key}='{value}' (its scale file does)")


def template_kwargs(name_or_path: str, enable_thinking: bool, pinned: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments the chat template is rendered with, beside the messages."""
    fam = family_of(name_or_path)
    switch = {"enable_thinking": enable_thinking} if fam is None or fam.thinking_switch else {}
    return {**switch, **pinned}


def stop_ids(tokenizer_eos: int | None, generation_eos: int | Iterable[int] | None) -> list[int]:
    """End-of-turn ids: the tokenizer's eos and every id of generation_config's eos_token_id."""
    ids = {tokenizer_eos} if tokenizer_eos is not None else set()
    if isinstance(generation_eos, int):
        ids.add(generation_eos)
    elif generation_eos is not None:
        ids.update(int(i) for i in generation_eos)
    return sorted(ids)


def prepare_messages(messages: Sequence[dict[str, str]], system_prompt: str | None,
                     policy: str) -> list[dict[str, str]]:
    """A workflow's conversation as the template gets it: the cell's system prompt first
    where the conversation has none, consecutive turns of one role handled by `policy`."""
    out = [dict(m) for m in messages]
    if system_prompt is not None and (not out or out[0]["role"] != "system"):
        out.insert(0, {"role": "system", "content": system_prompt})
    if policy == "keep":
        return out
    if policy == "critic_as_user":
        # A model turn right after another model turn is the critique of it: shown as the user's.
        for k in range(1, len(out)):
            if out[k]["role"] == out[k - 1]["role"] == "assistant":
                out[k]["role"] = "user"
    elif policy != "merge":
        raise FamilyError(f"model.message_policy '{policy}' is not one of {', '.join(MESSAGE_POLICIES)}")
    merged: list[dict[str, str]] = []
    for message in out:
        if merged and merged[-1]["role"] == message["role"] and message["role"] != "system":
            merged[-1] = {**merged[-1], "content": merged[-1]["content"] + "\n\n" + message["content"]}
        else:
            merged.append(message)
    return merged


def alternation_problem(messages: Sequence[dict[str, str]]) -> str | None:
    """Where a conversation breaks user/assistant alternation (after an optional system turn),
    as a template that requires it would refuse it; None when it alternates."""
    turns = [m["role"] for m in messages]
    if turns and turns[0] == "system":
        turns = turns[1:]
    for k, role in enumerate(turns):
        expected = "user" if k % 2 == 0 else "assistant"
        if role != expected:
            return f"turn {k + 1} is {role} where {expected} must come ({' -> '.join(turns)})"
    return None


def lora_scope_problem(name_or_path: str, target_modules: str) -> str | None:
    """A LoRA target that would wrap more than a multimodal checkpoint's language model."""
    try:
        arch = published(name_or_path)
    except UnknownArchitecture:
        return None
    if "language_model_of" in arch and target_modules == "all-linear":
        return (f"{name_or_path} is a vision-language checkpoint and lora.target_modules=all-linear would wrap its "
                f"vision tower too: set lora.target_modules to the language model's layers (its scale file does)")
    return None
