"""Real Qwen3 architecture, random weights, on CPU: the paper's shapes before any GPU.

Slow (about 15 minutes on 2 cores): Qwen3-0.6B has 0.6B parameters and a 151,936-entry vocabulary,
so these runs exercise what the toy world cannot: the real widths and vocabulary, the PPO
token budget cutting a mini-batch into several micro-batches, the chunked output layer,
and the math and code tasks inside training (the code reward through the sandbox).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from gridrun.grid.compose import Composer
from gridrun.grid.plan import run_config
from gridrun.seam.runconfig import dump_config
from gridrun.seam.rundir import RunDir
from gridrun.tasks.data import prepare

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
# Lengths cut so a step fits a CPU; the budget (320 tokens) is still smaller than one
# adapter's mini-batch, so the packing into micro-batches is live.
SHORT = ["lengths.max_prompt_tokens=1024", "lengths.max_response_tokens=16", "train.micro_token_budget=320",
         "model.dtype=float32", "logging.wandb_mode=disabled"]


def test_gpu_check_runs_one_step_on_cpu() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu.py"), "--device", "cpu", "--scales", "0.6b", "--workflows", "single",
         "--policies", "shared", "--problems", "1", "--n", "2", "--rollout-tokens", "4", "--response-tokens", "16",
         "--token-budget", "48", "--json"],
        capture_output=True, text=True, timeout=1800, check=True,
    )
    (result,) = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert "error" not in result, result
    # Completions extended from 4 sampled tokens to 16; each of the 2 sequences (prompt + 16,
    # wider than the 48-token budget) is a micro-batch of its own.
    assert result["response_tokens"] == 16 and result["rollout_tokens"] == 4
    assert result["largest_micro_tokens"] > 48 and result["micro_batches"] >= 2
    # 0.6B float32 weights alone are 2.2 GiB.
    print(f"gpu check on cpu: peak RSS {result['peak_gb']['process_rss']:.2f} GiB, step {result['step_s']} s")
    assert 2.2 < result["peak_gb"]["process_rss"] < 12


def _cell(tmp_path: Path, task: str, workflow: str, policy: str, *overrides: str) -> RunDir:
    data = tmp_path / "data"
    fixture = {"math": FIXTURES / "dapo_math_sample.parquet", "code": FIXTURES / "deepcoder_sample.jsonl"}[task]
    prepare(task, fixture, data / task, val_size=3)
    tree = Composer().compose(["scale=0.6b", f"task={task}", f"workflow={workflow}", f"policy={policy}", "engine=hf",
                               "model.init=random", f"grid.data_root={data}", "train.total_steps=1",
                               "train.batch_problems=2", "train.ppo_mini_batch=2", "grpo.n=2", *SHORT])
    config = run_config(tree, {"id": f"{workflow}-{task}", "kind": "train", "seed": 0})
    run_dir = RunDir(tmp_path / config.cell.id)
    run_dir.root.mkdir()
    run_dir.config_yaml.write_text(dump_config(config))
    return run_dir


@pytest.fixture(autouse=True)
def every_core(monkeypatch: pytest.MonkeyPatch) -> None:
    # run_cell trains on GRIDRUN_THREADS threads (1 by default, for cells sharing a machine).
    monkeypatch.setenv("GRIDRUN_THREADS", str(os.cpu_count() or 1))


def test_math_trains_one_step_with_validation(tmp_path: Path) -> None:
    from gridrun.cellrun import run_cell

    run_dir = _cell(tmp_path, "math", "voting", "isolated", "train.val_problems=1")
    assert run_cell(run_dir.root) == 0, run_dir.read_state().to_json().get("error")
    print(f"voting-ip math: peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")
    rows = run_dir.read_metrics()
    # Validations at 0 and 1 around the step, then the peak's one test evaluation.
    assert [r["split"] for r in rows] == ["val", "train", "val", "test"]
    train = rows[1]
    # 1 problem x 2 rollouts: the generator adapter holds 3 voters' 6 turns, the aggregator's 2;
    # mini-batches of 1 x 2 sequences give it 3 optimizer steps to the aggregator's 1.
    assert train["role/generator/opt_steps"] == 3 and train["role/aggregator/opt_steps"] == 1
    assert "val/role/aggregator/len_p50" in rows[2] or any(k.startswith("val/role/aggregator/") for k in rows[2])


def test_code_reward_runs_in_the_sandbox_inside_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A random model writes no code, so every completion's text is replaced by an a + b
    program: the fixture's validation split holds the a + b problem, and only a program
    that really ran in the sandbox can score there."""
    from gridrun.cellrun import run_cell
    from gridrun.train.engines.hf import HFEngine

    program = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    generate = HFEngine.generate

    def writes_a_program(self, requests, sampling):
        return [type(c)(c.token_ids, c.logprobs, program, c.finish_reason) for c in generate(self, requests, sampling)]

    monkeypatch.setattr(HFEngine, "generate", writes_a_program)
    run_dir = _cell(tmp_path, "code", "eval_opt", "shared")
    assert run_cell(run_dir.root) == 0, run_dir.read_state().to_json().get("error")
    print(f"eval_opt-sp code: peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")
    val = [r for r in run_dir.read_metrics() if r["split"] == "val"]
    # 1 of the 3 validation problems is a + b: the program passes its tests there only.
    assert [round(r["val/acc"], 3) for r in val] == [0.333, 0.333]
