"""`gridrun run <run_dir>`: one cell's base model resolved to files, then the trainer.

A cell's config.yaml says `model.name_or_path: toy` (and its fingerprint hashes exactly
that); the directory the toy world is built in is a run-time fact of this machine's cache,
found or built here and handed to the trainer. This module sits above the training half
and the toy world so that neither imports the other (tests/test_seam.py checks): the toy
world's build uses the trainer's parts, the trainer never sees the toy recipe.

Left out: the run itself (gridrun/train/trainer.py: lock, state.json, the loop) and the
build (gridrun/toy/build.py).
"""

from __future__ import annotations

from pathlib import Path

from gridrun.runconfig import ModelSpec, ToySpec


def model_files(spec: ModelSpec) -> str:
    """What the trainer loads the base model from: the toy world's directory (built once,
    cached by recipe) for `name_or_path: toy`, else name_or_path itself. `init=random` reads
    only a tokenizer, the default toy world's, mapped into the architecture's vocabulary."""
    if spec.name_or_path == "toy" or spec.init == "random":
        from gridrun.toy.build import ensure_toy_world

        return str(ensure_toy_world(spec.toy or ToySpec()))
    return spec.name_or_path


def run_cell(path: Path) -> int:
    """Run the cell in `path` to its end; the process exit code."""
    from gridrun.train.trainer import run_under_lock

    return run_under_lock(path, model_files)
