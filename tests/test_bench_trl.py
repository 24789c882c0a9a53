"""The benchmarks that measure gridrun against TRL run end to end (the slow suite; CI installs
the bench extra first). Their ratios are measured by `make bench`, never asserted here: this
only keeps the scripts working as gridrun changes under them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("trl", reason="the bench extra: pip install -e '.[bench]' (CI installs it)")

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _run(script: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, str(BENCH / script), *args, "--json"], capture_output=True, text=True, check=False,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_trl_step_benchmark_times_both_sides() -> None:
    result = _run("trl.py", "--pairs", "1")
    assert result["pairs"] == 1 and result["gridrun_s"] > 0 and result["trl_s"] > 0
    assert all(tokens > 0 for tokens in result["tokens_per_step"])


def test_the_update_benchmark_times_trl_on_the_same_rows() -> None:
    result = _run("update.py", "--model", "toy", "--repeats", "1", "--problems", "1", "--n", "2",
                  "--response-tokens", "24", "--token-budget", "256")
    assert result["trl"]["s"] > 0 and result["trl"]["tokens_computed"] > 0
    assert result["packed_over_trl"] > 0 and result["padded_over_trl"] > 0
