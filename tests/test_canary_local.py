"""`gridrun canary cluster=local` end to end on this machine's CPU (issue 29): the canary's
shape on the toy world, run by the local launcher, reported from its run dir alone.
Slow: about a minute on 2 busy cores (3 steps of 8 problems x 8 rollouts, 4 calls each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_the_canary_runs_on_cpu_and_says_go(toy_world: Path, tmp_path: Path) -> None:
    env = {**os.environ, "GRIDRUN_RESULTS": str(tmp_path / "results")}
    done = subprocess.run([sys.executable, "-m", "gridrun.cli", "canary", "cluster=local", "--cpu"],
                          capture_output=True, text=True, env=env, timeout=900, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "canary voting-ip-toy-arith-s0: done" in out
    assert "rank 0/1 on " in out and ": CPU; CUDA_VISIBLE_DEVICES=" in out
    assert "free GPU memory before the engine sleeps n/a (CPU), after n/a (CPU) (step 3)" in out
    # Voting: the voters' stage (8 problems x 8 rollouts x 3) and the aggregators' (x 1).
    assert "rollout stage 0: 192 requests, " in out and "rollout stage 1: 64 requests, " in out
    assert "gather across ranks 0.000 s" in out
    assert "adapter check aggregator: " in out and "adapter check generator: " in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("GO: projected ") and "for full_matrix (72 cells; CPU toy world, not a GPU number;" in last
    # Its step is kept for later plans (the dry run takes it for cells of its shape).
    kept = json.loads((tmp_path / "results" / "canary" / "measured-step.json").read_text())
    assert kept["shape"] == {"workflow": "voting", "task": "arith", "model": "toy", "policy": "isolated", "gpu": "cpu",
                             "engine": "hf"} and kept["batch_problems"] == 8 and kept["step_s"] > 0
