"""One GRPO step of each model family's real architecture (random weights, cut to a CPU's
size by model.arch_overrides, as the CPU canary cuts Qwen3), under Shared and Isolated
Policy, with the HF engine: its class, vocabulary, special tokens, turn format and stop ids
through the whole loop, no hub needed. On the toy arithmetic task, whose prompts are a few
dozen tokens (the plan pairs it with the toy model only; composed here directly): with the
math task's prompts every run takes ~10 s against ~2 s, the families' vocabularies
(up to 262,144 rows) being most of each step's work. The math task at the paper's shapes on
the real architectures: tests/test_real_arch.py (slow)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gridrun.grid.compose import Composer
from gridrun.grid.plan import run_config
from gridrun.seam.runconfig import dump_config
from gridrun.seam.rundir import RunDir

SCALES = ["qwen2.5-0.5b", "llama3.2-1b", "gemma3-1b", "phi4mini-3.8b", "smollm2-1.7b"]
# The fast suite keeps Phi-4-mini under Shared Policy (fused projections: its own LoRA layout)
# and Gemma's Eval-Opt under Isolated Policy (below); the other runs, 3-8 s each on 2 idle
# cores, are slow-marked to keep `make test` under its budget.
FAST = {("phi4mini-3.8b", "shared")}
CELLS = [pytest.param(scale, policy, marks=() if (scale, policy) in FAST else pytest.mark.slow)
         for scale in SCALES for policy in ("shared", "isolated")]
TINY = ["+model.arch_overrides.num_hidden_layers=1", "+model.arch_overrides.hidden_size=64",
        "+model.arch_overrides.intermediate_size=128", "+model.arch_overrides.num_attention_heads=2",
        "+model.arch_overrides.num_key_value_heads=1"]
# Short enough for a fast test; every response runs to its limit (a random model never stops).
SHORT = ["lengths.max_prompt_tokens=512", "lengths.max_response_tokens=4", "train.micro_token_budget=1024",
         "model.dtype=float32", "logging.wandb_mode=disabled", "train.total_steps=1", "train.batch_problems=1",
         "train.ppo_mini_batch=1", "grpo.n=2", "train.val_problems=1", "lora.rank=4"]


@pytest.fixture(autouse=True)
def every_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRIDRUN_THREADS", str(os.cpu_count() or 1))


def _cell(tmp_path: Path, scale: str, policy: str, workflow: str, *extra: str) -> RunDir:
    tree = Composer().compose([f"scale={scale}", "task=arith", f"workflow={workflow}", f"policy={policy}", "gpu=cpu",
                               "engine=hf", "model.init=random", *TINY, *SHORT, *extra])
    config = run_config(tree, {"id": f"{workflow}-{policy}-{scale}", "kind": "train", "seed": 0})
    run_dir = RunDir(tmp_path / config.cell.id)
    run_dir.root.mkdir()
    run_dir.config_yaml.write_text(dump_config(config))
    return run_dir


def _trains_one_step(run_dir: RunDir) -> list[dict]:
    from gridrun.cellrun import run_cell

    assert run_cell(run_dir.root) == 0, run_dir.read_state().to_json().get("error")
    rows = run_dir.read_metrics()
    # Validation at 0 and 1 around the step, then the peak's one test evaluation.
    assert [r["split"] for r in rows] == ["val", "train", "val", "test"]
    return rows


@pytest.mark.parametrize(("scale", "policy"), CELLS)
def test_family_trains_one_voting_step(tmp_path: Path, scale: str, policy: str) -> None:
    rows = _trains_one_step(_cell(tmp_path, scale, policy, "voting", "workflow.n_voters=2"))
    train = rows[1]
    # Every role's tokens reached the update: two voters' and the aggregator's responses at the limit.
    assert train["role/generator/len_mean"] == 4 and train["role/aggregator/len_mean"] == 4


def test_gemma_trains_eval_opt_with_the_critique_shown_as_a_user_turn(tmp_path: Path) -> None:
    # Gemma's turn format raises on two assistant turns in a row: the scale file's critic_as_user
    # is what lets the revision call render at all.
    rows = _trains_one_step(_cell(tmp_path, "gemma3-1b", "isolated", "eval_opt", "workflow.rounds=2"))
    assert rows[1]["role/evaluator/len_mean"] == 4
