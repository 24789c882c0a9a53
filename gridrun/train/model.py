"""Loading the base model and tokenizer: the same code for the toy world and Qwen3."""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gridrun.runconfig import ModelSpec, ToySpec


class ModelLoadError(RuntimeError):
    pass


def model_path(spec: ModelSpec) -> str:
    if spec.name_or_path == "toy":
        return str(_toy_dir(spec.toy))
    return spec.name_or_path


def _toy_dir(toy: ToySpec) -> Any:
    from gridrun.toy.build import ensure_toy_world

    return ensure_toy_world(toy)


def load_base(spec: ModelSpec, device: torch.device | None = None) -> tuple[Any, Any]:
    """(frozen base model on `device`, left-padding tokenizer)."""
    device = device or torch.device("cpu")
    dtype = getattr(torch, spec.dtype)
    if spec.init == "random":
        from gridrun.arch import UnknownArchitecture
        from gridrun.train.random_init import load_random

        try:
            model, tokenizer = load_random(spec.name_or_path, dtype, device, _toy_dir(spec.toy))
        except UnknownArchitecture as err:
            raise ModelLoadError(str(err)) from None
    else:
        path = model_path(spec)
        try:
            # transformers 5 does not persist padding_side: set it at load time.
            tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        except OSError as err:
            raise ModelLoadError(
                f"cannot load model '{path}' ({err.__class__.__name__}): on a machine without hub access, "
                "download it elsewhere (`hf download <id> --local-dir DIR`) and set model.name_or_path=DIR"
            ) from err
        model.to(device)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.requires_grad_(False)
    return model, tokenizer
