"""Where a trained adapter is found: a cell's checkpoint at a step, an export, a peft folder.

Both `gridrun export` (which copies a checkpoint's adapters out) and the evaluation cells
(kinds `transfer` and `eval`, whose roles run on adapters trained elsewhere) resolve
adapters here, so a step means the same thing to both: `peak` is the first step of the
highest validation accuracy (Table 1's peak; the trainer keeps its checkpoint), `last` the
newest complete checkpoint, a number that step.

An evaluation cell names each role's source in `policy.adapters` (role -> source). A
source is a path, taken from the cell's own run dir when relative, or the id of a cell of
the same sweep, with an optional `@peak`, `@last` or `@N` (default: last):
- a peft adapter folder (holds adapter_config.json): that adapter serves the role;
- a `gridrun export` folder (holds roles.json): the adapter it gives the same role;
- a run dir: the checkpoint at the step, its adapter for the same role.
An export or run whose adapters are one (Shared-Policy, SA-RL) serves any role with it.
A run dir must be done. Every adapter folder handed out is verified first (`verify_adapter`:
its config is JSON, each safetensors file's header parses and its tensors fill the file
exactly), so a truncated or garbled file is one line naming it, before anything is copied or
loaded. Torch-free: paths and JSON only. Left out: loading the weights (gridrun/train/policy.py
does) and checking the tensors' values.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gridrun.seam.accuracy import first_peak, val_accuracy
from gridrun.seam.cellstate import FINISHED_STATES
from gridrun.seam.errors import UserError
from gridrun.seam.rundir import COMPLETE_MARKER, ROLES_FILE, RunDir, adapter_dir

STEP_CHOICES = "peak, last or a step number"
PEFT_CONFIG = "adapter_config.json"
_HEADER_MAX = 100 << 20  # safetensors' own limit on a header's size
_REWRITE = "re-run the cell (or export another step) to write it again"


class AdapterSourceError(UserError, ValueError):
    """An adapter that cannot be found or used, and the fix, in one line."""


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint of a cell, with what its run says about that step."""

    run_dir: RunDir
    step: int
    path: Path
    # Validation accuracy at this step (None: not validated here).
    val_acc: float | None

    def roles(self) -> dict[str, str | None]:
        """role -> adapter of this checkpoint (None: the base model). A checkpoint written
        before role maps were recorded, holding one adapter: that adapter, for any role."""
        try:
            return json.loads((self.path / ROLES_FILE).read_text())
        except FileNotFoundError:
            folders = sorted(p.parent.name for p in (self.path / "adapters").glob(f"*/{PEFT_CONFIG}"))
            if len(folders) == 1:
                return {"*": folders[0]}
            raise AdapterSourceError(
                f"{self.path} has no {ROLES_FILE} (written by a gridrun before role maps were recorded): "
                "re-run the cell to write its checkpoints again"
            ) from None
        except ValueError:
            raise AdapterSourceError(f"{self.path / ROLES_FILE} is damaged (not JSON): re-run the cell") from None

    def adapters(self) -> dict[str, Path]:
        """adapter name -> its peft folder, in the role map's order."""
        names = dict.fromkeys(a for a in self.roles().values() if a is not None)
        found = {name: adapter_dir(self.path, name) for name in names}
        for name, folder in found.items():
            if not (folder / PEFT_CONFIG).is_file():
                raise AdapterSourceError(f"{self.path} lacks adapter '{name}': the checkpoint is damaged, re-run the cell")
            verify_adapter(folder)
        return found


@dataclass(frozen=True)
class PeakCheckpoint:
    """Where the checkpoint of a trained cell's peak is: the one lookup behind `collect`'s
    `peak_checkpoint` column, `collect --export-peaks` and `@peak`."""

    step: int
    # The complete checkpoint's folder; None at step 0 (the base model) or when it is gone.
    path: Path | None

    @property
    def base_model(self) -> bool:
        """A peak at step 0: the base model before any update, no trained adapter."""
        return self.step == 0

    @property
    def deleted(self) -> bool:
        """Not on disk (a run older than peak retention, or removed by hand)."""
        return not self.base_model and self.path is None

    def describe(self) -> str:
        """As cells.parquet and Table 1's csv write it: the folder, "base model" or "deleted"."""
        if self.base_model:
            return "base model"
        return "deleted" if self.path is None else str(self.path)


def peak_checkpoint(run_dir: RunDir, peak_step: int) -> PeakCheckpoint:
    """The checkpoint at a cell's peak step (its first highest validation, `first_peak`)."""
    if peak_step == 0:
        return PeakCheckpoint(0, None)
    path = run_dir.checkpoint(peak_step)
    return PeakCheckpoint(peak_step, path if (path / COMPLETE_MARKER).exists() else None)


def verify_adapter(folder: Path) -> None:
    """AdapterSourceError, naming the file and the fix, unless `folder`'s peft files read
    whole: adapter_config.json is a JSON object, and each .safetensors file's header parses
    and its tensors' byte ranges end exactly at the file's end (a truncated copy does not)."""
    config = folder / PEFT_CONFIG
    try:
        whole = isinstance(json.loads(config.read_bytes()), dict)
    except (OSError, ValueError):
        whole = False
    if not whole:
        raise AdapterSourceError(f"{config} is damaged (not a JSON object): {_REWRITE}")
    weights = sorted(folder.glob("*.safetensors"))
    if not weights and not (folder / "adapter_model.bin").is_file():
        raise AdapterSourceError(f"{folder} holds no adapter weights (adapter_model.safetensors): {_REWRITE}")
    for path in weights:
        problem = _safetensors_problem(path)
        if problem:
            raise AdapterSourceError(f"{path} is damaged ({problem}): {_REWRITE}")


def _safetensors_problem(path: Path) -> str | None:
    """What is wrong with a safetensors file's framing (8-byte header length, JSON header,
    data offsets covering the rest), None when it is whole. Reads the header only."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if size < 8 or length > min(size - 8, _HEADER_MAX):
                return f"truncated: {size} bytes, fewer than its header alone needs"
            header = json.loads(f.read(length))
    except OSError as err:
        return f"unreadable: {err.strerror}"
    except ValueError:
        return "its header is not JSON"
    if not isinstance(header, dict):
        return "its header is not a JSON object"
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            return f"tensor {str(name)[:60]!r} has no valid data offsets"
        end = max(end, offsets[1])
    if 8 + length + end != size:
        return f"{'truncated' if 8 + length + end > size else 'trailing bytes'}: {size} bytes, its header describes {8 + length + end}"
    return None


def find_checkpoint(run_dir: RunDir, which: str | int = "peak", val_acc: Mapping[int, float] | None = None) -> Checkpoint:
    """The complete checkpoint at `which` (peak, last or a step); AdapterSourceError naming
    the steps on disk when it is not there. `val_acc`: the cell's step -> validation accuracy
    where the caller has read its metrics already (None reads metrics.jsonl)."""
    on_disk = dict(run_dir.complete_checkpoints())
    steps = ", ".join(map(str, on_disk)) or "none"
    name = run_dir.root.name
    acc = val_accuracy(run_dir.read_metrics()) if val_acc is None else val_acc
    if which == "peak":
        peak = first_peak(acc)
        if peak is None:
            raise AdapterSourceError(f"{name} has no validation yet, so no peak: name a step instead (on disk: {steps})")
        step = peak[0]
        if peak_checkpoint(run_dir, step).base_model:
            raise AdapterSourceError(
                f"{name} peaked at step 0, the base model before any update: there is no trained adapter "
                f"there; name the last step or a number (on disk: {steps})"
            )
    elif which == "last":
        if not on_disk:
            raise AdapterSourceError(f"{name} has no complete checkpoint: run it first (`gridrun run {run_dir.root}`)")
        step = max(on_disk)
    else:
        try:
            step = int(which)
        except ValueError:
            raise AdapterSourceError(f"step {which!r} is not {STEP_CHOICES}") from None
    if step not in on_disk:
        raise AdapterSourceError(f"{name} has no checkpoint at step {step} on disk (steps on disk: {steps})")
    return Checkpoint(run_dir, step, on_disk[step], acc.get(step))


def _for_role(roles: dict[str, str | None], role: str, where: str) -> str:
    """The adapter a role map gives `role`; a map with one adapter gives it to any role."""
    if roles.get(role) is not None:
        return str(roles[role])
    names = {a for a in roles.values() if a is not None}
    if len(names) == 1:
        return names.pop()
    raise AdapterSourceError(
        f"{where} has no adapter for role '{role}' (its roles: "
        f"{', '.join(r for r, a in roles.items() if a is not None) or 'none'}): name another source for it"
    )


def resolve(source: str, role: str, run_dir: Path | None = None) -> Path:
    """The peft folder that serves `role`, from one `policy.adapters` source (see above)."""
    where, at, step = source.rpartition("@")
    if not at or not (step in ("peak", "last") or step.isdigit()):
        where, step = source, ""  # no step named (an "@" elsewhere in a path is the path's)
    named = Path(where)
    path = (run_dir / named) if run_dir is not None and not named.is_absolute() else named
    if run_dir is not None and not path.exists() and "/" not in where:
        path = run_dir.parent / where  # a cell id of the same sweep
    path = path.resolve()
    exported = (path / PEFT_CONFIG).is_file() or (path / ROLES_FILE).is_file()
    if exported and step:
        raise AdapterSourceError(f"{source}: @{step} picks a step of a run, but {path} holds one adapter set: drop @{step}")
    if (path / PEFT_CONFIG).is_file():
        verify_adapter(path)
        return path
    if (path / ROLES_FILE).is_file():
        try:
            roles = json.loads((path / ROLES_FILE).read_text())
        except ValueError:
            raise AdapterSourceError(f"{path / ROLES_FILE} is damaged (not JSON): export the cell again") from None
        folder = path / _for_role(roles, role, str(path))
        verify_adapter(folder)
        return folder
    source_dir = RunDir(path)
    if not source_dir.config_yaml.is_file():
        raise AdapterSourceError(
            f"adapter source {path} is neither a run dir, an export nor a peft adapter folder: plan the cell it "
            "names, or point policy.adapters at an adapter"
        )
    record = source_dir.read_state()
    if record.state not in FINISHED_STATES:
        total = "?" if record.total_steps is None else record.total_steps
        raise AdapterSourceError(
            f"adapter source {path.name} is {record.state} at step {record.step}/"
            f"{total}, not done: finish it first (`gridrun resubmit --cells {path.name}`)"
        )
    if not source_dir.complete_checkpoints():
        raise AdapterSourceError(f"adapter source {path.name} is done but has no complete checkpoint: re-run it")
    found = find_checkpoint(source_dir, step or "last")
    return found.adapters()[_for_role(found.roles(), role, f"{path.name} at step {found.step}")]
