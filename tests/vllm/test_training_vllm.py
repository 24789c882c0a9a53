"""Training runs with engine=vllm: every workflow x policy completes two steps with the same
metric keys as engine=hf (plus the live-adapter proof's `adapter_check/` keys), the proof
passes at every refresh (honest runs never trip it; sabotaged ones are in
test_adapter_check.py), and the trainer's log-probs agree with the rollouts' after each
update."""

from __future__ import annotations

from pathlib import Path

import pytest

from gridrun.cellrun import run_cell
from gridrun.seam.rundir import RunDir
from tests.conftest import make_cell

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("toy_world")]

WORKFLOWS = ("single", "eval_opt", "voting", "orch_workers")
CHECK = "adapter_check/"


def run(tmp_path: Path, name: str, workflow: str, policy: str, engine: str) -> list[dict]:
    # TOY_CELL validates on 16 problems: with fewer, a key that needs one correct answer
    # (the aggregator's select_acc) can be missing from one of the two runs by chance.
    rounds = {"rounds": 2} if workflow == "eval_opt" else {}
    cell = make_cell(tmp_path, name, workflow={"name": workflow, **rounds}, policy={"name": policy},
                     engine={"name": engine})
    assert run_cell(cell) == 0, RunDir(cell).read_state().to_json().get("error")
    return RunDir(cell).read_metrics()


def keys(rows: list[dict], split: str) -> set[str]:
    # vLLM's rollout is continuous, one `time/stage0_*` for the whole rollout; hf's has one per stage.
    return set().union(*(r.keys() for r in rows if r["split"] == split)) - {
        k for r in rows for k in r if k.startswith((CHECK, "time/stage"))}



@pytest.mark.parametrize("policy", ["shared", "isolated"])
@pytest.mark.parametrize("workflow", WORKFLOWS)
def test_two_steps_with_vllm_log_what_hf_logs(tmp_path: Path, workflow: str, policy: str) -> None:
    from gridrun.train.engines.vllm import AGREEMENT_LIMIT, agreement_failures

    vllm_rows = run(tmp_path, "vllm", workflow, policy, "vllm")
    hf_rows = run(tmp_path, "hf", workflow, policy, "hf")
    assert [r["step"] for r in vllm_rows if r["split"] == "train"] == [1, 2]
    assert {r["step"] for r in vllm_rows if r["split"] == "val"} == {0, 2}
    for split in ("train", "val"):
        assert keys(vllm_rows, split) == keys(hf_rows, split), split
    # Step 2 rolls out with the adapters refreshed after step 1's update.
    for row in (r for r in vllm_rows if r["split"] == "train"):
        assert not agreement_failures(row, AGREEMENT_LIMIT["float32"]), row
        # Every role's proof, in the canary's keys, within the noise limit (the run would have stopped otherwise).
        roles = {k.split("/")[1] for k in row if k.startswith("role/")}
        assert {k for k in row if k.startswith(CHECK)} == {"adapter_check/seconds"} | {
            f"{CHECK}{r}/{v}" for r in roles for v in ("served", "trainer", "zero", "gap", "perturbed_gap")}
        assert all(row[f"{CHECK}{r}/gap"] <= AGREEMENT_LIMIT["float32"] for r in roles), row


def test_greedy_validation_equals_hf(tmp_path: Path) -> None:
    # Same prompts, stop tokens, decoding and scoring: greedy answers agree token for token
    # (fp32; a near-tie could flip one, none does on these 16 problems).
    rows = {}
    for engine in ("hf", "vllm"):
        cell = make_cell(tmp_path, engine, cell={"kind": "base"}, workflow={"name": "voting"},
                         engine={"name": engine}, sampling={"val_temperature": 0.0})
        assert run_cell(cell) == 0, RunDir(cell).read_state().to_json().get("error")
        # Its step-0 validation and the one test evaluation of that step.
        rows[engine] = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in RunDir(cell).read_metrics()]
        assert [r["split"] for r in rows[engine]] == ["val", "test"]
        rows[engine].append({"samples": RunDir(cell).samples(0).read_text()})
    assert rows["vllm"] == rows["hf"]
