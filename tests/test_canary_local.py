"""`gridrun canary cluster=local` end to end on this machine's CPU (issue 29), as a newcomer
runs it (issue 42): no prepared data, no hub. The canary's cell (Voting-IP, Qwen3-1.7B's
class, math, on the math sample shipped with gridrun) against `model.init=random` cut to a
CPU's size (canary.CPU_SHAPE), run by the local launcher, reported from its run dir alone.
Slow: 30-70 s on 2 cores (2 steps of 2 problems x 2 rollouts, 4 calls each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gridrun.seam.rundir import RunDir

pytestmark = pytest.mark.slow


def test_the_canary_runs_the_real_cell_on_a_random_model_on_cpu_and_says_go(tmp_path: Path) -> None:
    results = tmp_path / "results"
    # Nothing prepared, an empty hub cache that may not be asked.
    env = {**os.environ, "GRIDRUN_RESULTS": str(results), "GRIDRUN_DATA": str(tmp_path / "data"),
           "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "gridrun.cli", "canary", "cluster=local"],
                          capture_output=True, text=True, env=env, timeout=900, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert f"math data at {tmp_path / 'data' / 'math'} lacks train.jsonl, val.jsonl, meta.json: this CPU canary " \
           "trains on the 38-problem math sample shipped with gridrun" in out
    # No GPU here: --cpu is the default, and the cell is the real one's id.
    assert "(CPU: a random-init model of the cell's architecture, cut to CPU size)" in out
    assert "canary voting-ip-1.7b-math-s0: done" in out
    assert "rank 0/1 on " in out and ": CPU; CUDA_VISIBLE_DEVICES=unset (trainer cpu, engine hf" in out
    assert "GPU memory at the hand-overs: n/a (CPU) (step 2)" in out
    # Voting: the voters' stage (2 problems x 2 rollouts x 3 voters) and the aggregators' (x 1),
    # every response at its 8-token limit (a random model never stops).
    assert "rollout stage 0: 12 requests, " in out and ", 96 tokens (" in out
    assert "rollout stage 1: 4 requests, " in out and ", 32 tokens (" in out
    assert "gather across ranks 0.000 s" in out
    assert "adapter check aggregator: not run (engine hf" in out and "adapter check generator: not run (engine hf" in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("GO: projected ") and "for full_matrix (72 cells; CPU random-init model, not a GPU number;" in last
    # The cell trained Qwen3's class on the math task with two LoRA adapters (IP).
    (cell,) = (results / "canary" / "cells").iterdir()
    config = (cell / "config.yaml").read_text()
    assert "name_or_path: Qwen/Qwen3-1.7B" in config and "init: random" in config and "num_hidden_layers: 2" in config
    assert "gridrun/tasks/math_sample" in config and not (tmp_path / "data").exists()
    rows = RunDir(cell).read_metrics()
    train = [r for r in rows if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    assert {"role/generator/opt_steps", "role/aggregator/opt_steps"} <= set(train[-1])
    # Its step is kept for later plans (the dry run takes it for cells of its shape).
    kept = json.loads((results / "canary" / "measured-step.json").read_text())
    assert kept["shape"] == {"workflow": "voting", "task": "math", "model": "Qwen/Qwen3-1.7B", "policy": "isolated",
                             "gpu": "cpu", "engine": "hf"} and kept["batch_problems"] == 2 and kept["step_s"] > 0
