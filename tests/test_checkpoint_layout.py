"""Checkpoints resume across a changed GPU layout and onto the CPU, never at the cost of the
metrics, and both of Qwen3's end-of-turn tokens stop generation (issue 30, item 8)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import AutoTokenizer

from gridrun.arch import QWEN3_SPECIAL_IDS
from gridrun.cellrun import run_cell
from gridrun.seam.rundir import RunDir
from gridrun.train.engines.hf import stop_token_ids
from gridrun.train.random_init import tokenizer_dir
from tests.conftest import make_cell
from tests.states import reopen


@contextlib.contextmanager
def _tagged_cuda() -> Iterator[None]:
    """torch.save writes every storage as if it lived on cuda:0 (what a GPU run writes)."""
    entry = (0, lambda storage: "cuda:0" if storage.device.type == "cpu" else None, lambda obj, location: None)
    registry = torch.serialization._package_registry
    registry.insert(0, entry)
    try:
        yield
    finally:
        registry.remove(entry)


def _more_steps(cell: Path, before: int, after: int) -> None:
    config = cell / "config.yaml"
    config.write_text(config.read_text().replace(f"total_steps: {before}", f"total_steps: {after}"))
    reopen(cell)


def test_a_gpu_checkpoint_with_per_gpu_rng_states_resumes_on_the_cpu(tmp_path: Path) -> None:
    cell = make_cell(tmp_path, train={"total_steps": 1, "val_every": 1})
    assert run_cell(cell) == 0
    ckpt = RunDir(cell).checkpoint(1)
    state = torch.load(ckpt / "trainer.pt", weights_only=False)
    optimizers = torch.load(ckpt / "optimizers.pt", weights_only=False)
    # The layout before one GPU per task: one CUDA RNG state per visible GPU.
    state["cuda_rng"] = [torch.zeros(16, dtype=torch.uint8), torch.ones(16, dtype=torch.uint8)]
    with _tagged_cuda():
        torch.save(state, ckpt / "trainer.pt")
        torch.save(optimizers, ckpt / "optimizers.pt")
    _more_steps(cell, 1, 2)
    assert run_cell(cell) == 0, RunDir(cell).read_state().to_json().get("error")
    assert [r["step"] for r in RunDir(cell).read_metrics() if r["split"] == "train"] == [1, 2]


def test_moving_the_last_checkpoint_aside_keeps_the_metrics(tmp_path: Path) -> None:
    cell = make_cell(tmp_path, train={"total_steps": 2, "val_every": 1, "save_every": 1})
    assert run_cell(cell) == 0
    run = RunDir(cell)
    before = run.metrics_jsonl.read_text()
    for _, path in run.complete_checkpoints():
        path.rename(path.with_name(path.name + ".bad"))
    _more_steps(cell, 2, 3)
    assert run_cell(cell) == 0
    kept = sorted(cell.glob("metrics.jsonl.replaced-*"))
    assert [p.read_text() for p in kept] == [before], "the rows no checkpoint matches are kept aside"
    assert [r["step"] for r in run.read_metrics() if r["split"] == "train"] == [1, 2, 3]


def test_both_qwen3_end_tokens_stop_generation(toy_world: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir(toy_world)))
    assert tokenizer.eos_token == "<|im_end|>"  # Qwen3's own config: the second eos is pad
    stops = set(stop_token_ids(tokenizer))
    assert {QWEN3_SPECIAL_IDS["<|im_end|>"], QWEN3_SPECIAL_IDS["<|endoftext|>"]} <= stops
