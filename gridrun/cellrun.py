"""`gridrun run <run_dir>`: one cell's base model resolved to files, then the trainer.

A cell's config.yaml says `model.name_or_path: toy` or a hub id (and its fingerprint hashes
exactly that); the directory the toy world is built in, like the local folder a cluster
profile names for a hub id, is a run-time fact of this machine, found (or built) here and
handed to the trainer. This module sits above the training half
and the toy world so that neither imports the other (tests/test_seam.py checks): the toy
world's build uses the trainer's parts, the trainer never sees the toy recipe.

Left out: the run itself (gridrun/train/trainer.py: lock, state.json, the loop) and the
build (gridrun/toy/build.py).
"""

from __future__ import annotations

from pathlib import Path

from gridrun.modelfiles import model_dirs_from_env, model_source
from gridrun.runconfig import ModelSpec, ToySpec


def model_files(spec: ModelSpec) -> str:
    """What the trainer loads the base model from: the toy world's directory (built once,
    cached by recipe) for `name_or_path: toy`; the local folder the cluster profile's
    model_dirs names for the hub id ($GRIDRUN_MODEL_DIRS, set by the launcher), else
    name_or_path itself (a hub id resolves in the hub cache). `init=random` reads only a
    tokenizer, the default toy world's, mapped into the architecture's vocabulary."""
    if spec.name_or_path == "toy" or spec.init == "random":
        from gridrun.toy.build import ensure_toy_world

        return str(ensure_toy_world(spec.toy or ToySpec()))
    return model_source(spec.name_or_path, model_dirs_from_env())


def run_cell(path: Path) -> int:
    """Run the cell in `path` to its end; the process exit code."""
    from gridrun.train.trainer import run_under_lock

    return run_under_lock(path, model_files)
