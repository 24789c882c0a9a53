"""Where a cell's base model is read from on this machine: a local folder the cluster profile
names for its hub id, else the Hugging Face cache (`HF_HOME`), which `gridrun fetch` fills.

A cell's config.yaml names its model by hub id (`model.name_or_path: Qwen/Qwen3-1.7B`), and
its fingerprint, its scale and the memory model's architecture (gridrun/arch/) are keyed on
that id. Where the files sit is a fact of the machine, like the toy world's cache: the
cluster profile's `model_dirs` (hub id -> folder) is grid-only, so it is in no config.yaml
and no fingerprint; the launchers hand it to each cell as `$GRIDRUN_MODEL_DIRS` (JSON), and
the run entry (gridrun/cellrun.py) loads the folder while the config keeps the hub id.

A folder counts as a whole checkpoint (`incomplete`) when it holds config.json,
tokenizer_config.json, the tokenizer's files (tokenizer.json, or vocab.json and merges.txt) and
every weight shard its safetensors index
names (or model.safetensors). Keeping the hub id in the config matters: naming a folder in
`model.name_or_path` instead would give every cell another fingerprint, lose the
architecture and load one model for every scale; a load that fails names `gridrun fetch`
and `model_dirs` (gridrun/train/model.py).

Both halves use it: the grid to check, before anything is queued, that every cell's files
are there (gridrun/grid/fetch.py); the run entry to resolve them. Standard library only: it
reads the cache's documented layout (`hub/models--<org>--<name>/refs/main` names the
snapshot under `snapshots/<commit>/`) instead of importing huggingface_hub, which a
login node's grid-only install lacks.

Left out: downloading (gridrun/grid/fetch.py), revisions other than `main`, GGUF and
PyTorch-pickle (`*.bin`) weights (Qwen3 ships safetensors).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

# The launchers set it for each cell from the cluster profile's model_dirs (a JSON object).
MODEL_DIRS_ENV = "GRIDRUN_MODEL_DIRS"
# What `from_pretrained` and vLLM read of a Qwen3 checkpoint (README, LICENSE left out).
MODEL_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.jinja")


def is_hub_id(name_or_path: str) -> bool:
    """`Qwen/Qwen3-1.7B` (org/name, not a path on this machine), as from_pretrained reads it."""
    parts = name_or_path.split("/")
    return len(parts) == 2 and all(parts) and not name_or_path.startswith((".", "~")) and not Path(name_or_path).exists()


def hub_cache() -> Path:
    """The hub cache folder huggingface_hub uses: $HF_HUB_CACHE, else $HF_HOME/hub, else
    ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or str(Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface")
    return Path(home).expanduser() / "hub"


def cached_snapshot(repo_id: str, cache: Path | None = None) -> Path | None:
    """The folder of `repo_id`'s `main` snapshot in the hub cache; None when none was fetched."""
    repo = (cache or hub_cache()) / f"models--{repo_id.replace('/', '--')}"
    try:
        commit = (repo / "refs" / "main").read_text().strip()
    except OSError:
        return None
    return repo / "snapshots" / commit if commit else None


def incomplete(folder: Path) -> str | None:
    """Why `folder` is not a whole checkpoint (config, tokenizer, every weight shard), or None."""
    if not folder.is_dir():
        return f"{folder} does not exist"
    needed = ["config.json", "tokenizer_config.json"]
    if not (folder / "tokenizer.json").is_file():
        needed += ["vocab.json", "merges.txt"]
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            needed += sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError):
            return f"{index} is not a safetensors index"
    else:
        needed.append("model.safetensors")
    absent = [name for name in needed if not (folder / name).is_file()]
    return f"{folder} lacks {', '.join(absent)}" if absent else None


def model_dirs_env(model_dirs: Mapping[str, str]) -> dict[str, str]:
    """The environment that hands a cell `model_dirs` ({} when there are none)."""
    return {MODEL_DIRS_ENV: json.dumps(dict(model_dirs), sort_keys=True)} if model_dirs else {}


def model_dirs_from_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The hub id -> folder map a launcher handed this cell ({} when none)."""
    text = (os.environ if env is None else env).get(MODEL_DIRS_ENV, "")
    if not text:
        return {}
    try:
        dirs = json.loads(text)
    except ValueError:
        dirs = None
    if not isinstance(dirs, dict) or not all(isinstance(v, str) for v in dirs.values()):
        raise ValueError(f"${MODEL_DIRS_ENV} must be a JSON object of hub id -> folder, not {text!r}")
    return dirs


def model_source(name_or_path: str, model_dirs: Mapping[str, str]) -> str:
    """What `from_pretrained` loads for `name_or_path`: its folder in `model_dirs`, else itself
    (a hub id then resolves in the hub cache, offline in jobs)."""
    folder = model_dirs.get(name_or_path)
    return str(Path(folder).expanduser()) if folder else name_or_path


def missing_model(name_or_path: str, model_dirs: Mapping[str, str]) -> str | None:
    """Why this machine cannot load `name_or_path` without a download, or None when it can."""
    if name_or_path in model_dirs:
        why = incomplete(Path(model_dirs[name_or_path]).expanduser())
        return None if why is None else f"model {name_or_path}: its folder in the cluster profile's model_dirs: {why}"
    if not is_hub_id(name_or_path):
        why = incomplete(Path(name_or_path).expanduser())
        return None if why is None else f"model {name_or_path}: {why}"
    snapshot = cached_snapshot(name_or_path)
    if snapshot is None:
        return f"model {name_or_path} is not in the hub cache {hub_cache()}"
    why = incomplete(snapshot)
    return None if why is None else f"model {name_or_path} is incomplete in the hub cache ({why})"
