"""Loading the base model and tokenizer: the same code for the toy world and Qwen3.

The trainer is handed the base model's files, already resolved: `model.name_or_path: toy`
stays in config.yaml, and the run entry (gridrun/cellrun.py) builds or finds the toy world
and passes its directory here. Left out: building the toy world (gridrun/toy/, which this
half never imports) and downloading from the hub (`gridrun fetch`, on a login node).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gridrun.seam.errors import UserError
from gridrun.seam.runconfig import ModelSpec
from gridrun.train import cpu
from gridrun.train.precision import EmulatedDtype, check_cpu_dtype


class ModelLoadError(UserError, RuntimeError):
    pass


def _load_error(name: str, files: str, err: OSError) -> str:
    """The one line for a base model that did not load, naming commands that fix it (a job
    never downloads: HF_HUB_OFFLINE=1)."""
    first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
    where = f"'{files}'" + (f" (model.name_or_path {name})" if files != name else "")
    return (f"cannot load model {where}: {err.__class__.__name__}: {first}. On a login node with the sweep's "
            f"HF_HOME, run `gridrun fetch conf=<sweep>` (it downloads {name} into the hub cache), or name a local "
            f"copy in the cluster profile's model_dirs ({name}: DIR, e.g. filled by `hf download {name} "
            "--local-dir DIR`); the cell keeps its hub id, so resubmit it as it is")


def load_base(spec: ModelSpec, files: str, device: torch.device | None = None) -> tuple[Any, Any]:
    """(frozen base model on `device`, left-padding tokenizer).

    `files`: what `from_pretrained` loads (a directory or hub id). Under `init=random` only
    its tokenizer is read, mapped into the vocabulary of `spec.name_or_path`'s architecture."""
    device = device or torch.device("cpu")
    if device.type == "cpu":
        try:
            check_cpu_dtype(spec.dtype)
        except EmulatedDtype as err:
            raise ModelLoadError(str(err)) from None
    dtype = getattr(torch, spec.dtype)
    if spec.init == "random":
        from gridrun.arch import UnknownArchitecture
        from gridrun.train.random_init import load_random

        try:
            model, tokenizer = load_random(spec.name_or_path, dtype, device, Path(files), spec.arch_overrides)
        except UnknownArchitecture as err:
            raise ModelLoadError(str(err)) from None
    else:
        try:
            # transformers 5 does not persist padding_side: set it at load time.
            tokenizer = AutoTokenizer.from_pretrained(files, padding_side="left")
            model = AutoModelForCausalLM.from_pretrained(files, dtype=dtype)
        except OSError as err:
            raise ModelLoadError(_load_error(spec.name_or_path, files, err)) from err
        model.to(device)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if device.type == "cpu":
        cpu.install(model)
    model.requires_grad_(False)
    return model, tokenizer
