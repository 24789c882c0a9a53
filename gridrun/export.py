"""`gridrun export`: a cell's adapters at one step, in the standard form others load.

A trained cell's checkpoint holds one peft folder per adapter (Isolated-Policy: one per
role; Shared-Policy and SA-RL: one) and its role -> adapter map. `export` copies them out,
unchanged, next to a model card (README.md: the cell's coordinates, preset, base model,
step, the validation accuracy there, the commit) and `roles.json` (role -> adapter folder,
null for a role on the base model). Each folder loads with `PeftModel.from_pretrained(base,
folder)` and serves with vLLM's `LoRARequest(name, id, folder)`. `--merged` also writes the
base model with the adapter merged in (`merged/`), for a cell with one adapter only.

The step is `peak`, `last` or a number, as gridrun/adapters.py resolves it. It imports no
torch (the merged model is written by the writer its caller hands it), so the grid half calls it too (`gridrun collect
--export-peaks`). Left out: the base model's own files (the card names
them), and adapters of cells that train none (base, transfer, eval cells).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gridrun.adapters import AdapterSourceError, Checkpoint, find_checkpoint
from gridrun.seam.accuracy import first_peak, val_accuracy
from gridrun.seam.errors import UserError
from gridrun.seam.runconfig import ConfigError, RunConfig, load_config
from gridrun.seam.rundir import ROLES_FILE, DamagedFile, RunDir, disk_error


class ExportError(UserError, ValueError):
    """What cannot be exported, and the fix, in one line."""


# errno -> the fix, for an --out that cannot be written.
_OUT_FIXES = {
    errno.ENOSPC: "free space there or pass another --out", errno.EDQUOT: "free space there or pass another --out",
    errno.EROFS: "pass an --out on a writable disk", errno.EACCES: "pass an --out you can write",
    errno.EPERM: "pass an --out you can write", errno.ENOENT: "pass an --out whose parent folder can be created",
}


def _config(run_dir: RunDir) -> RunConfig:
    try:
        return load_config(run_dir.config_yaml)
    except ConfigError as err:
        raise ExportError(str(err)) from None


# Writes the base model with one adapter merged in: (the cell's config, the adapter's folder,
# the folder to write). gridrun/cellrun.py's `write_merged` loads the model with torch.
MergeWriter = Callable[[RunConfig, Path, Path], None]


def export(run_dir: RunDir, which: str | int = "peak", out: Path | None = None, merge: MergeWriter | None = None,
           val_acc: Mapping[int, float] | None = None) -> Path:
    """Write the cell's adapters at `which` into `out` (default: the run dir's exports/
    folder); returns `out`. Refuses an `out` that already exists (nothing is overwritten).
    `merge`: also write the base model with the adapter merged in (`merged/`), by that writer.
    `val_acc`: the cell's step -> validation accuracy where the caller has read its metrics
    already (`gridrun collect --export-peaks`); None reads metrics.jsonl, once."""
    merged = merge is not None
    config = _config(run_dir)
    if not config.trains:
        raise ExportError(
            f"{run_dir.root.name} is of kind {config.cell.kind}: it trains no adapter, so there is nothing to export "
            "(export the cell whose adapters it evaluates)"
        )
    acc = val_accuracy(run_dir.read_metrics()) if val_acc is None else val_acc
    try:
        found = find_checkpoint(run_dir, which, acc)
        adapters = found.adapters()
    except AdapterSourceError as err:
        raise ExportError(str(err)) from None
    out = out if out is not None else run_dir.export(found.step)
    if merged and len(adapters) != 1:
        raise ExportError(
            f"--merged writes one merged model, but {run_dir.root.name} has {len(adapters)} adapters "
            f"({', '.join(adapters)}, one per role): load them with peft instead"
        )
    if out.exists():
        raise ExportError(f"{out} already exists: remove it or pass another --out")
    target = out.resolve()
    for source in (found.path, *adapters.values()):
        if source.resolve() in (target, *target.parents):
            raise ExportError(f"--out {out} is inside {source}, which it copies: pass a folder outside it")
    tmp = out.parent / f".{out.name}.tmp"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            for name, folder in adapters.items():
                shutil.copytree(folder, tmp / name)
            (tmp / ROLES_FILE).write_text(json.dumps(found.roles(), indent=1) + "\n")
            (tmp / "README.md").write_text(model_card(config, found, adapters, merged, acc))
            if merge is not None:
                merge(config, tmp / next(iter(adapters)), tmp / "merged")
            os.replace(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    except OSError as err:  # a full, read-only or missing target: one line, nothing left behind
        message = disk_error(err if err.filename else OSError(err.errno, err.strerror, str(out)), _OUT_FIXES)
        if message is None:
            raise
        raise ExportError(message) from None
    return out


def _record(run_dir: RunDir) -> dict[str, Any]:
    try:
        return run_dir.read_record() or {}
    except DamagedFile:
        return {}


def model_card(config: RunConfig, found: Checkpoint, adapters: dict[str, Path], merged: bool,
               val_acc: Mapping[int, float]) -> str:
    """README.md of an export: what the adapters are and how to load them (`val_acc`: the
    cell's step -> validation accuracy, to say whether `found` is its peak)."""
    record = _record(found.run_dir)
    git = record.get("git") or {}
    commit = git.get("commit") or "unknown (no cell.json)"
    if git.get("dirty"):
        commit += " (with uncommitted changes)"
    model = config.model.name_or_path
    if config.model.toy is not None:
        model += f" (gridrun's toy world, recipe {json.dumps(vars(config.model.toy))})"
    split = config.train.val_split
    problems = f"every {split} problem" if config.train.val_problems is None else f"{config.train.val_problems} {split} problems"
    acc = "not validated at this step" if found.val_acc is None else (
        f"{100 * found.val_acc:.1f}% ({problems}, T={config.sampling.val_temperature})")
    peak = first_peak(val_acc)
    peak_note = " (the cell's peak)" if peak is not None and peak[0] == found.step else ""
    roles = found.roles()
    first = next(iter(adapters))
    lines = [
        f"# {config.cell.id} at step {found.step}",
        "",
        "LoRA adapters of a gridrun GRPO cell, exported by `gridrun export`.",
        "",
        "| | |",
        "|---|---|",
        f"| cell | `{config.cell.id}` ({config.cell.kind}) |",
        f"| workflow | {config.workflow.name} |",
        f"| task | {config.task.name} |",
        f"| policy | {config.policy.name} |",
        f"| seed | {config.cell.seed} |",
        f"| preset | {config.preset} |",
        f"| base model | {model}, {config.model.dtype} |",
        f"| step | {found.step} of {config.train.total_steps}{peak_note} |",
        f"| validation accuracy at this step | {acc} |",
        f"| commit | {commit} |",
        "",
        f"Roles and their adapter folders (`{ROLES_FILE}`; none = the base model):",
        "",
        *[f"- {role}: {adapter or 'none'}" for role, adapter in roles.items()],
        "",
        "Load with peft, or serve with vLLM:",
        "",
        "```python",
        "from peft import PeftModel",
        f'model = PeftModel.from_pretrained(base_model, "{first}")',
        "from vllm.lora.request import LoRARequest",
        f'request = LoRARequest("{first}", 1, "{first}")',
        "```",
        "",
    ]
    if merged:
        lines += ["`merged/` holds the base model with the adapter merged in (loads with transformers alone).", ""]
    return "\n".join(lines)
