"""`gridrun fetch conf=<sweep>`: everything a sweep's cells will load, put where jobs find it,
once, on a login node; and the check `gridrun plan` makes before it freezes a cell.

Jobs never download (setup_node.sh sets HF_HUB_OFFLINE=1: 72 jobs must not all hit the hub),
so before anything is queued each cell's base model and data must be on this machine's
shared storage:
- its model (weights, config, tokenizer) by hub id in the hub cache under `HF_HOME`
  (huggingface_hub's `snapshot_download`), or in the folder the cluster profile's
  `model_dirs` names for that hub id (gridrun/modelfiles.py: grid-only, so the cell's
  config.yaml, fingerprint, scale and architecture keep the hub id);
- its task's prepared data (`gridrun data prepare`'s train/val.jsonl + meta.json) at the
  cell's `task.data_path`, prepared from the hub or from `--data-from TASK=PATH`.
The toy world (built locally) and `model.init=random` (the shipped architecture, the toy
tokenizer) need no model; the toy task needs no data.

A model is fetched with the cache's allow patterns (modelfiles.MODEL_PATTERNS: config,
tokenizer and safetensors shards, no README), from `HF_ENDPOINT` where set (a site mirror).
A second run that finds everything prints `nothing to fetch: ... all present` and sends no
request to the hub.

`missing` is the one test of "are this cell's files here": plan, fetch and the preflight all
call it. The plan refuses in one line naming `gridrun fetch` for the same sweep and
overrides; `--dry-run` prints a `not fetched yet:` line instead. Fetching is idempotent: what is present is never fetched again, and a second run
says so. Left out: gated models (`hf auth login` first), revisions other than `main`,
pruning old snapshots (`hf cache` does that).
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gridrun import modelfiles
from gridrun.grid.errors import GridError
from gridrun.seam.runconfig import RunConfig

if TYPE_CHECKING:
    from gridrun.grid.plan import Plan

# Files of a prepared data set (gridrun/tasks/prepared.py); meta.json is written last.
DATA_FILES = ("train.jsonl", "val.jsonl", "meta.json")


@dataclass(frozen=True)
class FileNeed:
    """One thing a cell loads: a model (by hub id or path) or a task's prepared data."""

    kind: str  # "model" | "data"
    # The hub id (or path) of a model; the task's name for data.
    name: str
    # For data: the folder it is prepared into (the cell's task.data_path).
    path: str = ""


def cell_files(config: RunConfig) -> list[FileNeed]:
    """What this cell loads from disk that a job cannot make itself."""
    found = []
    if config.model.name_or_path != "toy" and config.model.init != "random":
        found.append(FileNeed("model", config.model.name_or_path))
    data_path = getattr(config.task, "data_path", None)
    if data_path:
        found.append(FileNeed("data", config.task.name, str(data_path)))
    return found


def absent(item: FileNeed, model_dirs: Mapping[str, str]) -> str | None:
    """Why `item` is not on this machine (one phrase), or None when it is."""
    if item.kind == "model":
        return modelfiles.missing_model(item.name, model_dirs)
    folder = Path(item.path)
    lacking = [name for name in DATA_FILES if not (folder / name).is_file()]
    return f"{item.name} data at {folder} lacks {', '.join(lacking)}" if lacking else None


def missing(config: RunConfig, model_dirs: Mapping[str, str]) -> list[str]:
    """Why this cell cannot run on this machine's files, one phrase per missing model or data
    set; [] when everything it loads is present. `model_dirs`: the cluster profile's."""
    return [why for why in (absent(item, model_dirs) for item in cell_files(config)) if why is not None]


def model_dirs_of(plan: Plan) -> dict[str, str]:
    """The plan's cluster profile's hub id -> local model folder map."""
    return dict(plan.cluster.get("model_dirs") or {})


def sweep_files(plan: Plan) -> list[FileNeed]:
    """Every distinct model and data set the plan's cells load, in plan order."""
    return list(dict.fromkeys(item for pc in plan.cells for item in cell_files(pc.config)))


def check_fetched(plan: Plan, command: str) -> None:
    """Refuse, in one line naming `command` (the fetch that fixes it), a plan with any cell
    whose model or data is not on this machine."""
    model_dirs = model_dirs_of(plan)
    reasons: dict[str, list[str]] = {}
    for pc in plan.cells:
        for why in missing(pc.config, model_dirs):
            reasons.setdefault(why, []).append(pc.id)
    if not reasons:
        return
    cells = {cell for ids in reasons.values() for cell in ids}
    shown = "; ".join(list(reasons)[:3]) + (f"; and {len(reasons) - 3} more" if len(reasons) > 3 else "")
    raise GridError(
        f"{len(cells)} of {len(plan.cells)} cells would fail in their job (jobs never download): {shown}. "
        f"Run `{command}` first on this login node (or name a local copy in the cluster profile's model_dirs)"
    )


@dataclass
class Fetched:
    """What `fetch` did."""

    fetched: list[str]
    present: list[str]


def fetch(plan: Plan, data_from: Mapping[str, str] | None = None, console: Any = None) -> Fetched:
    """Download every model and prepare every data set the plan's cells load that is not
    already here; what is present is left alone. A progress bar per item (and huggingface_hub's
    own per-file bars) while it runs."""
    model_dirs = model_dirs_of(plan)
    data_from = dict(data_from or {})
    items = sweep_files(plan)
    data_sets = [item.name for item in items if item.kind == "data"]
    unknown = sorted(set(data_from) - set(data_sets))
    if unknown:
        raise GridError(f"--data-from {unknown[0]}=...: no cell of the sweep loads {unknown[0]} data "
                        f"(its data sets: {', '.join(data_sets) or 'none'})")
    todo: list[FileNeed] = []
    present: list[FileNeed] = []
    for item in items:
        (present if absent(item, model_dirs) is None else todo).append(item)
    done: list[str] = []
    for item in _progress(todo, console):
        started = time.time()
        if item.kind == "model":
            where = _download(item.name, model_dirs)
        else:
            where = _prepare(item, data_from.get(item.name))
        done.append(f"{item.kind} {item.name} -> {where} ({time.time() - started:.0f} s)")
        if console is not None:
            console.print(f"fetched {done[-1]}", soft_wrap=True)
    return Fetched(fetched=done, present=[f"{n.kind} {n.name}" for n in present])


def _progress(items: list[FileNeed], console: Any) -> Iterable[FileNeed]:
    """`items` with a progress bar of the items done (on a terminal)."""
    if console is None or not items:
        yield from items
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, disable=not console.is_terminal) as bar:
        task = bar.add_task("fetching", total=len(items))
        for item in items:
            bar.update(task, description=f"fetching {item.kind} {item.name}")
            yield item
            bar.advance(task)


def _download(repo_id: str, model_dirs: Mapping[str, str]) -> str:
    if repo_id in model_dirs:
        raise GridError(
            f"model {repo_id}: the cluster profile's model_dirs names {model_dirs[repo_id]} for it, and "
            f"{modelfiles.missing_model(repo_id, model_dirs)}: copy the checkpoint there "
            f"(`hf download {repo_id} --local-dir {model_dirs[repo_id]}`) or drop it from model_dirs"
        )
    if not modelfiles.is_hub_id(repo_id):
        raise GridError(f"model {repo_id} is neither a hub id nor a whole checkpoint folder: "
                        f"{modelfiles.missing_model(repo_id, model_dirs)}")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ModuleNotFoundError:
        raise GridError("gridrun fetch downloads with huggingface_hub, which is not installed: in the "
                        "checkout, `make install-cluster` (or `pip install -e '.[train]'`)") from None
    try:
        # The cache and endpoint as the environment says now (huggingface_hub reads both once, at import).
        path = snapshot_download(repo_id, allow_patterns=list(modelfiles.MODEL_PATTERNS),
                                 cache_dir=str(modelfiles.hub_cache()), endpoint=os.environ.get("HF_ENDPOINT") or None)
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else err.__class__.__name__
        raise GridError(f"cannot download {repo_id} ({err.__class__.__name__}: {first}): run gridrun fetch where "
                        "the hub is reachable (HF_ENDPOINT for a mirror), or name a local copy in the cluster "
                        "profile's model_dirs") from None
    why = modelfiles.incomplete(Path(path))
    if why is not None:
        raise GridError(f"downloaded {repo_id}, but {why}: is it a transformers checkpoint in safetensors?")
    return path


def _prepare(item: FileNeed, from_path: str | None) -> str:
    from gridrun.tasks.data import SOURCES, DataError, prepare

    if item.name not in SOURCES:
        raise GridError(f"{item.name} data at {item.path} is missing and gridrun cannot prepare task "
                        f"'{item.name}' (it prepares {', '.join(SOURCES)}): write its train.jsonl, val.jsonl "
                        "and meta.json there")
    try:
        done = prepare(item.name, from_path, item.path)
    except DataError as err:
        # fetch prepares with the defaults; the data command takes the split's settings too.
        raise GridError(f"{item.name} data: {err} (`gridrun data prepare {item.name} --out {shlex.quote(item.path)}` "
                        "takes --from PATH, --val-size, --test-size and --seed; gridrun fetch --data-from "
                        f"{item.name}=PATH prepares with the defaults)") from None
    except ModuleNotFoundError as err:
        raise GridError(f"preparing {item.name} data from the hub needs {err.name}: in the checkout, "
                        f"`make install-cluster` (or `pip install -e '.[train]'`), or pass --data-from "
                        f"{item.name}=PATH") from None
    return f"{done.out} ({done.n_train} train, {done.n_val} val, {done.n_test} test)"
