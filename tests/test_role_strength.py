"""Per-role update strength (loss weight, LR scale, optimizer steps, multiplicity
normalization) and I6, the gradient-direction coherence regularizer."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from gridrun.cellrun import model_files
from gridrun.seam import routing
from gridrun.seam.registry import ConfigError
from gridrun.seam.runconfig import config_from_dict, load_config
from gridrun.seam.rundir import RunDir
from gridrun.train.coherence import Coherence, coherence_scale
from gridrun.train.lr_schedule import ramp_reached
from gridrun.train.policy import adapter_parameters
from gridrun.train.trainer import Trainer
from gridrun.train.update import TrainSeq, UpdateSettings, update
from tests.conftest import TOY_CELL, make_cell, merge


def trainer_for(tmp_path: Path, name: str, **overrides: Any) -> Trainer:
    cell = make_cell(tmp_path, name, workflow={"name": "voting"}, **overrides)
    config = load_config(cell / "config.yaml")
    return Trainer(config, RunDir(cell), model_files(config.model))


def rollout_seqs(trainer: Trainer) -> list[TrainSeq]:
    """Real turns of 2 problems x 2 samples (12 generator, 4 aggregator turns), advantages +-1.
    The rollout draws from the torch seed, so two trainers of one seed get the same turns."""
    torch.manual_seed(0)
    episodes = trainer.rollout(trainer.task.train_problems()[:2], 2, 0.7)
    turns = [t for e in episodes for t in e.turns]
    return [
        TrainSeq(t.role, trainer.routing.adapter(t.role), t.prompt_ids, t.completion_ids, t.logprobs,
                 1.0 if i % 2 else -1.0, False)
        for i, t in enumerate(turns)
    ]


def step(trainer: Trainer, seqs: list[TrainSeq], lr: float, coherence: Coherence | None = None) -> dict[str, float]:
    lrs = {name: lr * routing.role_lr_scales(trainer.config).get(name, 1.0) for name in trainer.routing.trainable}
    fresh = [TrainSeq(s.role, s.adapter, s.prompt_ids, s.completion_ids, s.rollout_logp, s.advantage, s.truncated)
             for s in seqs]
    return update(trainer.model, trainer.routing, trainer.optimizers, fresh,
                  UpdateSettings.of(trainer.config, trainer.pad_id), lrs, random.Random(0), coherence=coherence)


def adapter(trainer: Trainer, name: str) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in adapter_parameters(trainer.model, name).items()}


def moved(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([(after[k] - before[k]).flatten() for k in before])


@pytest.mark.usefixtures("toy_world")
def test_role_weight_scales_exactly_that_roles_gradient_under_ip_and_sp(tmp_path: Path) -> None:
    # lr 0 keeps the weights, so every run reads the same gradients. The generator's loss
    # weighs 3: its gradient norm triples (IP: its adapter's norm before the clip; SP: the
    # part it adds to the shared adapter), and the aggregator's is unchanged.
    for policy, key in (("isolated", "adapter/{}/grad_norm"), ("shared", "role/{}/grad_norm")):
        trainer = trainer_for(tmp_path, policy, policy={"name": policy})
        seqs = rollout_seqs(trainer)
        plain = step(trainer, seqs, 0.0)
        trainer.config.grpo.role_weight = {"generator": 3.0}
        weighted = step(trainer, seqs, 0.0)
        assert weighted[key.format("generator")] == pytest.approx(3 * plain[key.format("generator")], rel=1e-5)
        assert weighted[key.format("aggregator")] == pytest.approx(plain[key.format("aggregator")], rel=1e-6)
    # Under SP the weight moves the generator's share of the adapter's gradient mass:
    # g share s -> 3s / (3s + (1 - s)).
    s = plain["role/generator/grad_share"]
    assert weighted["role/generator/grad_share"] == pytest.approx(3 * s / (3 * s + 1 - s), rel=1e-5)


@pytest.mark.usefixtures("toy_world")
def test_a_role_weight_of_zero_leaves_that_roles_adapter_untouched(tmp_path: Path) -> None:
    trainer = trainer_for(tmp_path, "zero", policy={"name": "isolated"}, grpo={"n": 2, "role_weight": {"generator": 0.0}})
    before = {name: adapter(trainer, name) for name in ("generator", "aggregator")}
    metrics = step(trainer, rollout_seqs(trainer), 1e-3)
    assert torch.count_nonzero(moved(before["generator"], adapter(trainer, "generator"))) == 0
    assert torch.count_nonzero(moved(before["aggregator"], adapter(trainer, "aggregator"))) > 0
    assert "adapter/generator/opt_steps" not in metrics and metrics["adapter/aggregator/opt_steps"] == 1


@pytest.mark.usefixtures("toy_world")
def test_under_ip_a_loss_weight_does_not_move_the_update_but_the_lr_scale_does(tmp_path: Path) -> None:
    # One mini-batch of the generator's (8 turns). AdamW's first step moves each weight by
    # lr * g / (|g| + eps) (bias-corrected m / sqrt(v)) plus the decoupled decay lr * wd * p:
    # a constant factor on g cancels except against eps = 1e-8 (weights whose gradient is
    # that small), so 3x the loss weight moves the adapter by the same step to under 2%
    # (0.6% measured), not 3x; both terms are linear in lr, so 3x the LR is exactly 3x the
    # move. Three trainers of one seed start from the same weights and roll out the same turns.
    deltas = {}
    for name, grpo, optim in (("plain", {}, {}), ("weight", {"role_weight": {"generator": 3.0}}, {}),
                              ("lr", {}, {"role_lr_scale": {"parallel": 3.0}})):
        trainer = trainer_for(tmp_path, name, policy={"name": "isolated"}, grpo={"n": 2, **grpo},
                              optim={"lr": 5e-4, "warmup_steps": 0, **optim})
        before = adapter(trainer, "generator")
        metrics = step(trainer, [s for s in rollout_seqs(trainer) if s.role == "generator"][:8], 1e-3)
        assert metrics["adapter/generator/opt_steps"] == 1
        deltas[name] = moved(before, adapter(trainer, "generator"))
    plain = deltas["plain"]
    assert torch.count_nonzero(plain) > 0
    assert float((deltas["weight"] - plain).norm() / plain.norm()) < 0.02
    # (to float32 rounding of the weights themselves: compared as a whole)
    assert float((deltas["lr"] - 3 * plain).norm() / (3 * plain).norm()) < 1e-5


@pytest.mark.usefixtures("toy_world")
def test_optimizer_steps_per_role_and_multiplicity_normalization(tmp_path: Path) -> None:
    # Mini-batch = 4 problems x n 2 = 8 sequences. The generator's 12 turns (3 voters) make
    # 2 steps as the paper cuts them (8 + 4); normalized (steps): 1; role_steps 6: 6 of 2.
    trainer = trainer_for(tmp_path, "steps", policy={"name": "isolated"})
    seqs = rollout_seqs(trainer)
    assert step(trainer, seqs, 0.0)["adapter/generator/opt_steps"] == 2
    trainer.config.grpo.multiplicity_norm = "steps"
    assert step(trainer, seqs, 0.0)["adapter/generator/opt_steps"] == 1
    trainer.config.grpo.multiplicity_norm = "off"
    trainer.config.optim.role_steps = {"generator": 6}
    metrics = step(trainer, seqs, 0.0)
    assert metrics["adapter/generator/opt_steps"] == 6 and metrics["adapter/aggregator/opt_steps"] == 1


def voting(policy: str, **nodes: Any) -> dict[str, Any]:
    return merge(TOY_CELL, {"workflow": {"name": "voting"}, "policy": {"name": policy}, **nodes})


def test_multiplicity_normalization_equals_one_slot_in_each_form() -> None:
    # Voting has k = 3 voters: share -> loss weight 1/3, lr -> LR x 1/3, steps -> one step.
    assert routing.role_weights(config_from_dict(voting("shared", grpo={"multiplicity_norm": "share"}))) == {
        "generator": pytest.approx(1 / 3)}
    assert routing.role_lr_scales(config_from_dict(voting("isolated", grpo={"multiplicity_norm": "lr"}))) == {
        "generator": pytest.approx(1 / 3)}
    assert routing.role_steps(config_from_dict(voting("isolated", grpo={"multiplicity_norm": "steps"}))) == {"generator": 1}
    # `parallel` names the parallel role whatever it is called; a role not listed weighs 1.
    assert routing.role_weights(config_from_dict(voting("shared", grpo={"role_weight": {"parallel": 2.0}}))) == {"generator": 2.0}


def test_lr_scale_ramps_linearly_from_one_to_its_value() -> None:
    # role_lr_scale 3 over a 10-step ramp: 1 + 2 * step / 10 until step 10, then 3; no ramp: 3 at once.
    ramped = config_from_dict(voting("isolated", optim={"role_lr_scale": {"parallel": 3.0}, "role_lr_ramp": 10}))
    assert [routing.role_lr_scales(ramped, ramp_reached(s, 10))["generator"] for s in (1, 5, 10, 30)] == pytest.approx([1.2, 2.0, 3.0, 3.0])
    at_once = config_from_dict(voting("isolated", optim={"role_lr_scale": {"parallel": 3.0}}))
    assert routing.role_lr_scales(at_once, ramp_reached(1, 0))["generator"] == 3.0
    # The ramp is on the scale; multiplicity_norm=lr still divides the result by k = 3.
    both = config_from_dict(voting("isolated", optim={"role_lr_scale": {"parallel": 3.0}, "role_lr_ramp": 4},
                                   grpo={"multiplicity_norm": "lr"}))
    assert routing.role_lr_scales(both, ramp_reached(2, 4))["generator"] == pytest.approx(2.0 / 3)


@pytest.mark.parametrize(("nodes", "message"), [
    ({"grpo": {"role_weight": {"generatr": 2.0}}}, "'generatr' is not a role of voting \\(did you mean 'generator'\\?\\)"),
    ({"optim": {"role_lr_scale": {"generator": 2.0}}}, "under policy shared one adapter trains every role"),
    ({"grpo": {"multiplicity_norm": "steps"}}, "use grpo.role_weight"),
    ({"optim": {"role_steps": {"generator": 0}}, "policy": {"name": "isolated"}}, "must be > 0"),
    ({"workflow": {"name": "eval_opt"}, "grpo": {"role_weight": {"parallel": 2.0}}}, "eval_opt has no parallel role"),
    ({"optim": {"role_lr_ramp": -1}, "policy": {"name": "isolated"}}, "optim.role_lr_ramp must be >= 0"),
])
def test_bad_role_strength_is_one_line_naming_the_fix(nodes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_dict(voting(nodes.pop("policy", {"name": "shared"})["name"], **nodes))


def test_coherence_gating_on_2d_gradients() -> None:
    # 1 - lambda * max(0, cos(g, ema)), lambda = 0.5, ema = (1, 0):
    ema = [torch.tensor([1.0, 0.0])]
    cases = {(2.0, 0.0): 0.5,                       # same direction: cos 1, damped by half
             (1.0, 1.0): 1 - 0.5 / math.sqrt(2),   # 45 degrees: cos 1/sqrt(2)
             (0.0, 3.0): 1.0,                       # orthogonal: cos 0, untouched
             (-1.0, 0.0): 1.0}                      # opposite: cos -1, gated at 0, untouched
    for grad, expected in cases.items():
        assert coherence_scale([torch.tensor(grad)], ema, 0.5) == pytest.approx(expected)
    assert coherence_scale([torch.tensor([1.0, 0.0])], None, 0.5) == 1.0  # no history yet
    assert coherence_scale([torch.zeros(2)], ema, 0.5) == 1.0  # no direction
    # The EMA (decay 0.5): (1, 0) starts it; then (0, 1) -> cos 0, scale 1, EMA (0.5, 0.5);
    # then (1, 0) -> cos 1/sqrt(2).
    tracker = Coherence(strength=0.5, decay=0.5)
    assert tracker.scale("generator", [torch.tensor([1.0, 0.0])]) == 1.0
    assert tracker.scale("generator", [torch.tensor([0.0, 1.0])]) == pytest.approx(1.0)
    assert torch.allclose(tracker.ema["generator"][0], torch.tensor([0.5, 0.5]))
    assert tracker.scale("generator", [torch.tensor([1.0, 0.0])]) == pytest.approx(1 - 0.5 / math.sqrt(2))
    assert tracker.scale("aggregator", [torch.tensor([1.0, 0.0])]) == 1.0  # each role its own EMA
    # A non-finite gradient (its step is skipped) leaves the EMA as it was.
    before = tracker.ema["generator"][0].clone()
    assert tracker.scale("generator", [torch.tensor([float("nan"), 1.0])]) == 1.0
    assert torch.equal(tracker.ema["generator"][0], before)


@pytest.mark.usefixtures("toy_world")
def test_coherence_damps_a_repeated_gradient_in_the_update(tmp_path: Path) -> None:
    # The aggregator's 4 turns are one mini-batch. lr 0: the second update sees the same
    # gradient as the first, cos 1 with its EMA, so lambda 0.5 halves it (the adapter's norm
    # before the clip); the first had no history and is left alone.
    trainer = trainer_for(tmp_path, "coherence", policy={"name": "isolated"})
    seqs = [s for s in rollout_seqs(trainer) if s.role == "aggregator"]
    tracker = Coherence(strength=0.5, decay=0.9)
    first = step(trainer, seqs, 0.0, tracker)
    second = step(trainer, seqs, 0.0, tracker)
    assert first["role/aggregator/coherence_scale"] == 1.0
    assert second["role/aggregator/coherence_scale"] == pytest.approx(0.5, rel=1e-5)
    assert second["adapter/aggregator/grad_norm"] == pytest.approx(0.5 * first["adapter/aggregator/grad_norm"], rel=1e-5)


@pytest.mark.usefixtures("toy_world")
def test_the_coherence_emas_are_checkpointed_and_resumed(tmp_path: Path) -> None:
    # A resumed run must scale its next gradients as the uninterrupted one would: the
    # per-role EMAs travel in the checkpoint's trainer state.
    from tests.states import put_state

    cell = make_cell(tmp_path, "resume", workflow={"name": "voting"}, policy={"name": "isolated"},
                     grpo={"n": 2, "coherence": 0.5})
    config = load_config(cell / "config.yaml")
    put_state(RunDir(cell), state="running", step=1, total_steps=2, attempt=1)
    first = Trainer(config, RunDir(cell), model_files(config.model))
    assert first.coherence is not None
    first.coherence.ema = {"generator": [torch.full((2,), 0.25)], "aggregator": [torch.tensor([1.0, -1.0])]}
    first.save(1)
    resumed = Trainer(config, RunDir(cell), model_files(config.model))
    assert resumed.resume() == 1 and resumed.coherence is not None
    assert resumed.coherence.ema.keys() == {"generator", "aggregator"}
    assert torch.equal(resumed.coherence.ema["aggregator"][0], torch.tensor([1.0, -1.0]))
