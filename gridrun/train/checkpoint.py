"""Checkpoints: every adapter, optimizer and RNG state and the data position, atomically.

A checkpoint is written into a hidden temp directory, fsynced, renamed to
`checkpoints/step_XXXXXX/`, and only then marked COMPLETE; resume takes the newest
directory with the marker, so a kill at any moment leaves either the previous checkpoint or
the new one, never a half one. A write the disk refuses (full, read-only) removes the temp
directory and is an OSError naming the checkpoint, whichever library wrote the file.
Adapters are saved in peft's format (one folder each), so they load directly into peft or
vLLM, beside `roles.json` (role -> adapter folder), which `gridrun export` reads.

Retention: the newest `keep` complete checkpoints, plus the steps in `protect` (the trainer
passes its peak validation's step, so the model behind Table 1's number is never deleted).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from peft import set_peft_model_state_dict
from safetensors import SafetensorError
from safetensors.torch import load_file

from gridrun.seam.rundir import COMPLETE_MARKER, ROLES_FILE, RunDir, adapter_dir, atomic_write_text


class CorruptCheckpoint(RuntimeError):
    pass


def _fsync_tree(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())


def save(
    run_dir: RunDir,
    step: int,
    model: Any,
    adapters: tuple[str, ...],
    optimizers: dict[str, torch.optim.Optimizer],
    trainer_state: dict[str, Any],
    keep: int,
    roles: dict[str, str | None] | None = None,
    protect: frozenset[int] = frozenset(),
) -> Path:
    """Write the checkpoint of `step`, then delete every complete one that is neither among
    the newest `keep` nor in `protect`. `roles`: each role's adapter (None: the base model)."""
    run_dir.check_present()  # a cell folder deleted under the run gets nothing written into it
    final = run_dir.checkpoint(step)
    tmp = final.parent / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    # The checkpoints folder only: a cell folder deleted under the run is not brought back.
    final.parent.mkdir(exist_ok=True)
    tmp.mkdir()
    try:
        if adapters:
            model.save_pretrained(tmp / "adapters", selected_adapters=list(adapters))
        if roles is not None:
            (tmp / ROLES_FILE).write_text(json.dumps(roles, indent=1) + "\n")
        _torch_save({name: opt.state_dict() for name, opt in optimizers.items()}, tmp / "optimizers.pt")
        _torch_save(trainer_state, tmp / "trainer.pt")
        _fsync_tree(tmp)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)  # a full disk leaves nothing half-written
        refused = _os_error(err)
        if refused is not None:
            raise OSError(refused.errno, refused.strerror, str(final)) from err
        raise
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    atomic_write_text(final / COMPLETE_MARKER, f"{step}\n")
    for old_step, old in run_dir.complete_checkpoints()[:-keep]:
        if old_step not in protect:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _torch_save(obj: Any, path: Path) -> None:
    """torch.save through a Python file, whose OSError (a full disk) torch's error keeps as
    its context; given a path, torch's own writer reports no errno."""
    with open(path, "wb") as handle:
        torch.save(obj, handle)


# How Rust's std::io::Error displays ("No space left on device (os error 28)"): safetensors'
# writer, under peft's save_pretrained, reports no errno otherwise.
_RUST_IO_ERROR = re.compile(r"(\w[^:()]*) \(os error (\d+)\)")


def _os_error(err: BaseException) -> OSError | None:
    """The operating system's refusal behind a failed write, if that is what it was: the
    error itself, one it was raised from or during, or one safetensors printed."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno:
            return seen
        found = _RUST_IO_ERROR.search(str(seen)) if isinstance(seen, SafetensorError) else None
        if found:
            return OSError(int(found.group(2)), found.group(1))
        seen = seen.__cause__ or seen.__context__
    return None


def load(
    checkpoint: Path, model: Any, adapters: tuple[str, ...], optimizers: dict[str, torch.optim.Optimizer]
) -> dict[str, Any]:
    """Restore adapters and optimizers in place; returns the trainer state (its tensors on the
    CPU: a checkpoint written on a GPU resumes on another GPU layout or on the CPU, and each
    optimizer moves its state onto its parameters' device as it loads it)."""
    try:
        _load_adapters(checkpoint, model, adapters)
        states = torch.load(checkpoint / "optimizers.pt", map_location="cpu", weights_only=False)
        for name, opt in optimizers.items():
            opt.load_state_dict(states[name])
        return torch.load(checkpoint / "trainer.pt", map_location="cpu", weights_only=False)
    except Exception as err:  # every failure mode of a damaged checkpoint ends here
        raise CorruptCheckpoint(
            f"checkpoint {checkpoint} cannot be loaded ({err.__class__.__name__}: {err}); "
            f"move it aside (e.g. `mv {checkpoint} {checkpoint}.bad`) to resume from the previous one"
        ) from err


def _load_adapters(checkpoint: Path, model: Any, adapters: tuple[str, ...]) -> None:
    for name in adapters:
        weights = load_file(adapter_dir(checkpoint, name) / "adapter_model.safetensors")
        result = set_peft_model_state_dict(model, weights, adapter_name=name)
        if getattr(result, "unexpected_keys", None):
            raise ValueError(f"unexpected keys in adapter '{name}': {result.unexpected_keys[:3]}")


def load_adapters(checkpoint: Path, model: Any, adapters: tuple[str, ...]) -> None:
    """Restore the adapters alone (the test evaluation of the peak's checkpoint)."""
    try:
        _load_adapters(checkpoint, model, adapters)
    except Exception as err:
        raise CorruptCheckpoint(f"the adapters of checkpoint {checkpoint} cannot be loaded "
                                f"({err.__class__.__name__}: {err})") from err
