"""Predicted disk of one cell: its checkpoints under the results folder and the vLLM engine's
adapter versions in TMPDIR. The dry run's disk columns and the preflight's free-space check
call `cell_disk`, the one owner of these numbers. Torch-free.

- A checkpoint (gridrun/train/checkpoint.py) holds every trained adapter in float32 (peft's
  save_pretrained of float32 LoRA weights) and its AdamW state (two float32 moments): 3x
  the adapter, 12 bytes per LoRA parameter per adapter; the RNG and trainer state are small.
- On disk at once, at the worst moment of a save: the newest `train.keep_checkpoints`, the
  peak validation's (kept until a higher peak replaces it; counted as one more, the case
  where it is not among the newest), and the new checkpoint's temporary copy, written in
  full before the oldest is deleted.
- vLLM (engine=vllm) serves adapters from files each rank writes under TMPDIR
  (gridrun/train/engines/vllm.py): per rank at most three versions of every adapter at once
  (the one served, the live-adapter check's perturbed copy, the new one before the old is
  evicted) plus the zero adapter, each float32.

Not counted: metrics.jsonl and samples/ (kilobytes to a few MB a cell), exports, wandb, the
base model in HF_HOME (shared by every cell).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gridrun.arch import lora_parameter_count
from gridrun.engine_params import VLLMParams
from gridrun.memory import architecture, trainable_adapters
from gridrun.seam.routing import adapter_groups
from gridrun.seam.runconfig import RunConfig

# float32 LoRA weights, then AdamW's two float32 moments: bytes per parameter.
ADAPTER_BYTES_PER_PARAM = 4
CHECKPOINT_BYTES_PER_PARAM = 3 * ADAPTER_BYTES_PER_PARAM
# Versions of every adapter a rank's vLLM engine may hold in TMPDIR at once.
ENGINE_VERSIONS = 3
GB = 1e9


@dataclass(frozen=True)
class DiskEstimate:
    """Bytes of one cell: `checkpoint` is one checkpoint; `results` the most its run directory
    holds (kept + peak + a save's temporary copy); `tmp` the most its engines hold in TMPDIR
    on its node (all ranks)."""

    checkpoint: float
    checkpoints_at_once: int
    tmp: float

    @property
    def results(self) -> float:
        return self.checkpoint * self.checkpoints_at_once

    @property
    def total(self) -> float:
        return self.results + self.tmp


def _toy_arch() -> dict[str, Any]:
    import gridrun.toy

    arch: dict[str, Any] = json.loads((Path(gridrun.toy.__file__).parent / "world" / "config.json").read_text())
    return arch


def cell_disk(config: RunConfig, ranks: int = 1) -> DiskEstimate | None:
    """The disk one cell needs at most (the module docstring lists the terms), its engine run
    by `ranks` processes on its node; None when its model's architecture is not known."""
    arch = _toy_arch() if config.model.toy is not None else architecture(config)
    if arch is None:
        return None
    lora = lora_parameter_count(arch, config.lora.rank)
    adapters = trainable_adapters(config)
    checkpoint = float(adapters * lora * CHECKPOINT_BYTES_PER_PARAM)
    # The newest kept + the peak's + the temporary copy; a cell that never trains saves nothing.
    at_once = config.train.keep_checkpoints + 2 if adapters and config.steps_to_train else 0
    served = len(adapter_groups(config)) or 1
    tmp = 0.0
    if isinstance(config.engine, VLLMParams):
        tmp = float(max(1, ranks) * (ENGINE_VERSIONS * served + 1) * lora * ADAPTER_BYTES_PER_PARAM)
    return DiskEstimate(checkpoint, at_once, tmp)
