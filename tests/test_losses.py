"""The policy-loss registry (gridrun/train/losses.py): a name picks the loss the update trains
with, an unknown name fails in one line, a taken name cannot be silently replaced."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch

from gridrun.cellrun import model_files
from gridrun.seam.registry import ConfigError
from gridrun.seam.runconfig import GRPOSpec, config_from_dict, load_config
from gridrun.seam.rundir import RunDir
from gridrun.train import losses
from gridrun.train.losses import register_policy_loss
from gridrun.train.trainer import Trainer
from gridrun.train.update import TrainSeq, UpdateSettings, update
from tests.conftest import TOY_CELL, make_cell, merge

# Every call of the custom loss: (role-free) sums of its inputs, to check what the update hands it.
CALLS: list[dict[str, float]] = []


@register_policy_loss("test_doubled_ratio")
def doubled_ratio(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, spec: GRPOSpec
) -> tuple[torch.Tensor, torch.Tensor]:
    """-2 A rho, no clipping; "clipped" marks the positive-advantage tokens, so clip_frac
    reports this loss's own flag and not vanilla's."""
    CALLS.append({"tokens": float(mask.sum()), "clip_high": spec.clip_high, "shape_ok": float(
        logp.shape == old_logp.shape == advantages.shape == mask.shape)})
    return -2.0 * advantages * torch.exp(logp - old_logp), advantages > 0


def test_an_unknown_loss_name_fails_in_one_line_naming_the_registered_ones() -> None:
    with pytest.raises(ConfigError) as error:
        losses.policy_loss("vanila")
    message = str(error.value)
    assert "\n" not in message and "'vanila'" in message
    assert "test_doubled_ratio, vanilla" in message and "register_policy_loss" in message
    # UpdateSettings checks its name when built, before any forward.
    settings = UpdateSettings(grpo=GRPOSpec(), minibatch_size=8, micro_token_budget=64, temperature=1.0,
                              grad_clip=1.0, pad_id=0)
    with pytest.raises(ConfigError, match="grpo.policy_loss: no policy loss 'vanila'"):
        dataclasses.replace(settings, policy_loss="vanila")


def test_a_taken_name_is_refused() -> None:
    with pytest.raises(ValueError, match="'vanilla' is registered already"):
        register_policy_loss("vanilla")(doubled_ratio)
    assert losses.policy_loss("vanilla") is losses.vanilla
    # Registering the same function twice (a module imported again) is harmless.
    assert register_policy_loss("test_doubled_ratio")(doubled_ratio) is doubled_ratio


@pytest.mark.usefixtures("toy_world")
def test_the_update_trains_with_the_registered_loss_it_names(tmp_path: Path) -> None:
    # Voting under IP, one hand-made mini-batch per adapter: generator rows with advantage +1
    # (3 completion tokens) and -1 (1 token), one aggregator row with 0.25 (2 tokens). Each
    # adapter's first mini-batch is on-policy (old log-probs = this forward, detached), so
    # rho = exp(0) = 1 on every token and a token's loss is -A (vanilla, unclipped: rho is
    # inside [0.8, 1.28] and A * rho above dual-clip's -3A) or -2A (the custom loss).
    # role/<r>/loss is the token mean of the loss: generator vanilla (3 * -1 + 1 * 1) / 4 =
    # -0.5, custom (3 * -2 + 1 * 2) / 4 = -1; aggregator -0.25 and -0.5. clip_frac: vanilla 0,
    # custom its positive-advantage tokens: generator 3 / 4, aggregator 2 / 2.
    cell = make_cell(tmp_path, "losses", workflow={"name": "voting"}, policy={"name": "isolated"})
    config = load_config(cell / "config.yaml")
    trainer = Trainer(config, RunDir(cell), model_files(config.model))
    rows = [("generator", [5, 6, 7], [11, 12, 13], 1.0), ("generator", [5, 6, 8], [14], -1.0),
            ("aggregator", [9, 10], [15, 16], 0.25)]

    def step(name: str) -> dict[str, float]:
        seqs = [TrainSeq(role, role, prompt, completion, [-1.0] * len(completion), advantage, False)
                for role, prompt, completion, advantage in rows]
        settings = dataclasses.replace(UpdateSettings.of(config, trainer.pad_id), policy_loss=name)
        # LR 0: the weights stay, so both losses see the same model.
        lrs = dict.fromkeys(trainer.routing.trainable, 0.0)
        return update(trainer.model, trainer.routing, trainer.optimizers, seqs, settings, lrs, random.Random(0))

    vanilla = step("vanilla")
    assert not CALLS
    custom = step("test_doubled_ratio")
    # One role-pure micro-batch per adapter, handed the run's GRPOSpec and (batch, T) tensors.
    assert sorted(call["tokens"] for call in CALLS) == [2.0, 4.0]
    assert all(call["clip_high"] == config.grpo.clip_high and call["shape_ok"] for call in CALLS)
    assert vanilla["role/generator/loss"] == pytest.approx(-0.5) and custom["role/generator/loss"] == pytest.approx(-1.0)
    assert vanilla["role/aggregator/loss"] == pytest.approx(-0.25)
    assert custom["role/aggregator/loss"] == pytest.approx(-0.5)
    assert vanilla["role/generator/clip_frac"] == 0.0 and custom["role/generator/clip_frac"] == 0.75
    assert custom["role/aggregator/clip_frac"] == 1.0
    # The custom loss is what is backpropagated: twice vanilla's loss on every token, so twice
    # its gradient (a factor of 2 is exact in floating point).
    for adapter in ("generator", "aggregator"):
        key = f"adapter/{adapter}/grad_norm"
        assert custom[key] == pytest.approx(2 * vanilla[key], rel=1e-6) and vanilla[key] > 0


def test_a_run_config_names_its_loss_and_a_module_loss_is_imported() -> None:
    # "<module>:<name>": importing the module registers the loss (this test module registers
    # test_doubled_ratio at import, as a researcher's module would).
    assert losses.policy_loss("tests.test_losses:test_doubled_ratio") is doubled_ratio
    with pytest.raises(ConfigError, match="grpo.policy_loss='mylab.nowhere:unclipped': plugin 'mylab.nowhere' cannot be imported"):
        losses.policy_loss("mylab.nowhere:unclipped")
    with pytest.raises(ConfigError, match="grpo.policy_loss: no policy loss 'nope'"):
        losses.policy_loss("tests.test_losses:nope")
    # The run config's grpo.policy_loss reaches the update's settings, checked when they are built.
    config = config_from_dict(merge(TOY_CELL, {"workflow": {"name": "voting"},
                                                "grpo": {"policy_loss": "tests.test_losses:test_doubled_ratio"}}))
    assert UpdateSettings.of(config, 0).policy_loss == "tests.test_losses:test_doubled_ratio"
    with pytest.raises(ConfigError, match="grpo.policy_loss: no policy loss 'vanila'"):
        UpdateSettings.of(dataclasses.replace(config, grpo=dataclasses.replace(config.grpo, policy_loss="vanila")), 0)
