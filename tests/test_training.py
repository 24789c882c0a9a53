"""GRPO training on the toy world: routing, update semantics, learning, resume."""

from __future__ import annotations

import dataclasses
import math
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from gridrun.cellrun import model_files, run_cell
from gridrun.seam.accuracy import val_accuracy
from gridrun.seam.runconfig import load_config
from gridrun.seam.rundir import RunDir
from gridrun.train.policy import adapter_parameters
from gridrun.train.trainer import Trainer
from gridrun.train.update import TrainSeq, UpdateSettings, update
from tests.conftest import make_cell, metric_rows, start_run, twin_cell
from tests.states import reopen

pytestmark = pytest.mark.usefixtures("toy_world")


def trainer_for(cell: Path) -> Trainer:
    config = load_config(cell / "config.yaml")
    return Trainer(config, RunDir(cell), model_files(config.model))


def snapshot(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def changed(before: dict[str, torch.Tensor], model) -> set[str]:
    return {n for n, p in model.named_parameters() if not torch.equal(before[n], p.detach())}


def seqs_for(trainer: Trainer, roles: list[str]) -> list[TrainSeq]:
    """Real rollout turns of the given roles, with alternating +-1 advantages."""
    episodes = trainer.rollout(trainer.task.train_problems()[:2], 2, 0.7)
    turns = [t for e in episodes for t in e.turns if t.role in roles]
    return [
        TrainSeq(t.role, trainer.routing.adapter(t.role), t.prompt_ids, t.completion_ids, t.logprobs,
                 1.0 if i % 2 else -1.0, False)
        for i, t in enumerate(turns)
    ]


def run_update(trainer: Trainer, seqs: list[TrainSeq]) -> dict[str, float]:
    return update(trainer.model, trainer.routing, trainer.optimizers, seqs, UpdateSettings.of(trainer.config, trainer.pad_id),
                  {name: 1e-3 for name in trainer.routing.trainable}, random.Random(0))


def test_isolated_role_tokens_change_only_their_adapter(tmp_path: Path) -> None:
    trainer = trainer_for(make_cell(tmp_path, workflow={"name": "voting"}, policy={"name": "isolated"}))
    before = snapshot(trainer.model)
    run_update(trainer, seqs_for(trainer, ["aggregator"]))
    moved = changed(before, trainer.model)
    assert moved and all(".aggregator." in n for n in moved)
    assert moved == set(adapter_parameters(trainer.model, "aggregator")) - {
        n for n in adapter_parameters(trainer.model, "aggregator") if n not in moved
    }


def test_isolated_two_adapters_in_one_step_both_learn(tmp_path: Path) -> None:
    # The peft trap: a set_adapter switch between forwards of one summed loss drops the first
    # adapter's gradients. Both adapters must move, and nothing else.
    trainer = trainer_for(make_cell(tmp_path, workflow={"name": "voting"}, policy={"name": "isolated"}))
    before = snapshot(trainer.model)
    run_update(trainer, seqs_for(trainer, ["generator", "aggregator"]))
    moved = changed(before, trainer.model)
    assert any(".generator." in n for n in moved) and any(".aggregator." in n for n in moved)
    assert all("lora_" in n for n in moved), "base weights must never change"


def test_shared_policy_trains_one_adapter_from_every_role(tmp_path: Path) -> None:
    trainer = trainer_for(make_cell(tmp_path, workflow={"name": "orch_workers"}, policy={"name": "shared"}))
    before = snapshot(trainer.model)
    metrics = run_update(trainer, seqs_for(trainer, ["orchestrator", "worker", "synthesizer"]))
    moved = changed(before, trainer.model)
    assert moved and all(".shared." in n and "lora_" in n for n in moved)
    # Per-role diagnostics exist under SP too, and the gradient-mass shares add up to 1.
    shares = [metrics[f"role/{r}/grad_share"] for r in ("orchestrator", "worker", "synthesizer")]
    assert sum(shares) == pytest.approx(1.0) and all(s > 0 for s in shares)
    assert metrics["role/worker/token_share"] > metrics["role/orchestrator/token_share"]


def test_voting_ip_generator_takes_three_times_the_optimizer_steps(tmp_path: Path) -> None:
    # batch 4 problems x n=2 -> 8 episodes; mini-batch = 4 x 2 = 8 sequences. The generator
    # adapter gets 24 sequences (3 voters) -> 3 steps; the aggregator's 8 -> 1 step.
    cell = make_cell(tmp_path, workflow={"name": "voting"}, policy={"name": "isolated"},
                     train={"total_steps": 1, "val_every": 1})
    assert run_cell(cell) == 0
    row = next(r for r in RunDir(cell).read_metrics() if r["split"] == "train")
    assert row["adapter/generator/opt_steps"] == 3 and row["adapter/aggregator/opt_steps"] == 1
    assert row["role/generator/seqs"] == 3 * row["role/aggregator/seqs"] == 24


def test_lr_schedule_is_identical_under_shared_and_isolated(tmp_path: Path) -> None:
    # optim.lr_advance=per_step (preset=as_written): one advance per training step for every
    # adapter. Warmup 2 from 0, then cosine to step 3: 0, 5e-4 / 2, then 5e-4 (progress 0).
    rows = {}
    for policy in ("shared", "isolated"):
        cell = make_cell(tmp_path, policy, workflow={"name": "eval_opt", "rounds": 1},
                         policy={"name": policy}, optim={"warmup_steps": 2, "schedule": "cosine", "lr_advance": "per_step"},
                         train={"total_steps": 3, "val_every": 3, "save_every": 3, "batch_problems": 2})
        assert run_cell(cell) == 0
        rows[policy] = [r for r in RunDir(cell).read_metrics() if r["split"] == "train"]
    for policy, train_rows in rows.items():
        for row in train_rows:
            for key in (k for k in row if k.startswith("adapter/") and k.endswith("/lr")):
                assert row[key] == row["lr"], (policy, key)
    assert [r["lr"] for r in rows["shared"]] == [r["lr"] for r in rows["isolated"]] == pytest.approx([0.0, 2.5e-4, 5e-4])


def test_lr_per_update_advances_once_per_adapter_update(tmp_path: Path) -> None:
    # The released stepping (the schema's default): Voting under IP has 2 adapters, each
    # update_actor call advances the schedule. Warmup 4 from 0, lr 5e-4, constant after:
    # step 2's generator update comes after 2 advances (2/4 of the peak), its aggregator's
    # after 3 (3/4); per_step gives both 1 advance (1/4).
    cell = make_cell(tmp_path, workflow={"name": "voting"}, policy={"name": "isolated"},
                     optim={"warmup_steps": 4, "schedule": "constant"})
    trainer = trainer_for(cell)
    assert trainer.config.optim.lr_advance == "per_update"
    assert trainer.routing.trainable == ("generator", "aggregator")
    assert [trainer.lr(1, i, 2) for i in range(2)] == pytest.approx([0.0, 5e-4 / 4])
    assert [trainer.lr(2, i, 2) for i in range(2)] == pytest.approx([5e-4 * 2 / 4, 5e-4 * 3 / 4])
    assert [trainer.lr(3, i, 2) for i in range(2)] == pytest.approx([5e-4, 5e-4])
    per_step = dataclasses.replace(trainer.config.optim, lr_advance="per_step")
    trainer.config = dataclasses.replace(trainer.config, optim=per_step)
    assert [trainer.lr(2, i, 2) for i in range(2)] == pytest.approx([5e-4 / 4] * 2)


def one_minibatch_seqs(trainer: Trainer, roles: list[str]) -> list[TrainSeq]:
    """Real turns of one rollout whose rollout log-probs are shifted by -log 2: the trainer's
    pi_theta / pi_rollout is then exactly 2 on every token before the update."""
    seqs = seqs_for(trainer, roles)
    for s in seqs:
        s.rollout_logp = [v - math.log(2.0) for v in s.rollout_logp]
    return seqs


def test_chi2_is_e_rho_squared_minus_one_and_ppl_is_per_sequence(tmp_path: Path) -> None:
    # rho = 2 on every token (rollout log-probs shifted by log 2), one mini-batch (measured
    # before its optimizer step): chi2 = E[rho^2] - 1 = 3, chi2_centered = E[(rho - 1)^2] = 1.
    cell = make_cell(tmp_path, workflow={"name": "voting"}, policy={"name": "shared"},
                     train={"ppo_mini_batch": 64})
    trainer = trainer_for(cell)
    seqs = one_minibatch_seqs(trainer, ["generator", "aggregator"])
    generator = [s for s in seqs if s.role == "generator"]
    alone = [single_forward(trainer, s) for s in generator]  # before the update moves the weights
    metrics = run_update(trainer, seqs)
    for prefix in ("role/generator/", "role/aggregator/", "train/"):
        assert metrics[prefix + "chi2"] == pytest.approx(3.0, rel=1e-4)
        assert metrics[prefix + "chi2_centered"] == pytest.approx(1.0, rel=1e-4)
    # ppl: mean over sequences of exp(-mean log-prob) of the pre-update policy, here each
    # sequence's log-probs computed alone; entropy: that policy's too.
    per_seq = [math.exp(-logp.mean().item()) for logp, _ in alone]
    assert metrics["role/generator/ppl"] == pytest.approx(sum(per_seq) / len(per_seq), rel=1e-4)
    pooled = math.exp(-sum(logp.sum().item() for logp, _ in alone) / sum(len(logp) for logp, _ in alone))
    assert metrics["role/generator/ppl"] != pytest.approx(pooled, rel=1e-6)
    entropy = sum(ent.sum().item() for _, ent in alone) / sum(len(ent) for _, ent in alone)
    assert metrics["role/generator/entropy"] == pytest.approx(entropy, rel=1e-4)


def test_chi2_is_averaged_over_micro_batches_under_released_and_pooled_under_as_written(tmp_path: Path) -> None:
    # rho = 2 on every generator token (chi2 3) and the rollout's own log-probs on the
    # aggregator's (rho = 1, chi2 0 up to the engine's rounding); a token budget of 1 puts
    # every sequence in a micro-batch of its own, and lr 0 leaves the weights as they were for
    # the second reduction. micro_batch (verl): the mean over micro-batches, 3 x generator
    # sequences / all sequences; pooled: 3 x generator tokens / all tokens.
    cell = make_cell(tmp_path, workflow={"name": "voting"}, policy={"name": "shared"},
                     train={"ppo_mini_batch": 64, "micro_token_budget": 1})
    trainer = trainer_for(cell)
    seqs = seqs_for(trainer, ["generator", "aggregator"])
    for s in seqs:
        if s.role == "generator":
            s.rollout_logp = [v - math.log(2.0) for v in s.rollout_logp]
    generator = [s for s in seqs if s.role == "generator"]
    tokens = {role: sum(len(s.completion_ids) for s in seqs if s.role == role) for role in ("generator", "aggregator")}
    assert len(generator) == 3 * (len(seqs) - len(generator)) == 12 and tokens["generator"] != 3 * tokens["aggregator"]
    expected = {"micro_batch": 3 * 12 / 16, "pooled": 3 * tokens["generator"] / sum(tokens.values())}
    for reduction, chi2 in expected.items():
        trainer.config = dataclasses.replace(
            trainer.config, grpo=dataclasses.replace(trainer.config.grpo, chi2_reduction=reduction))
        metrics = update(trainer.model, trainer.routing, trainer.optimizers, [dataclasses.replace(s) for s in seqs],
                         UpdateSettings.of(trainer.config, trainer.pad_id), {"shared": 0.0}, random.Random(0))
        assert metrics["train/chi2"] == pytest.approx(chi2, abs=1e-3), reduction
        # Within one role every micro-batch has the same chi2, so both reductions agree there.
        assert metrics["role/generator/chi2"] == pytest.approx(3.0, rel=1e-4)
        assert metrics["role/aggregator/chi2"] == pytest.approx(0.0, abs=1e-3)


def single_forward(trainer: Trainer, seq: TrainSeq) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies of one sequence's completion under the current weights."""
    from gridrun.train.policy import activate
    from gridrun.train.update import _pack, completion_logprobs

    activate(trainer.model, seq.adapter)
    with torch.no_grad():
        logp, entropy = completion_logprobs(trainer.model, _pack([seq], trainer.pad_id),
                                            trainer.config.sampling.temperature, with_entropy=True)
    assert entropy is not None
    return logp[0], entropy[0]


def test_partial_mini_batch_is_scaled_by_rows_over_size(tmp_path: Path) -> None:
    # A mini-batch of 4 x n=2 = 8 sequences that holds only 6: released scales its loss, and
    # so its gradient, by 6 / 8; as_written weighs it fully. lr 0 leaves the weights as they
    # were, so both read the same gradient; its norm (before clipping) shows the factor.
    cell = make_cell(tmp_path, workflow={"name": "voting"}, policy={"name": "isolated"})
    trainer = trainer_for(cell)
    seqs = [s for s in seqs_for(trainer, ["generator"])][:6]
    assert len(seqs) == 6
    norms = {}
    for mode in ("scaled", "full"):
        trainer.config = dataclasses.replace(
            trainer.config, grpo=dataclasses.replace(trainer.config.grpo, partial_minibatch=mode)
        )
        metrics = update(trainer.model, trainer.routing, trainer.optimizers, [dataclasses.replace(s) for s in seqs],
                         UpdateSettings.of(trainer.config, trainer.pad_id), {"generator": 0.0, "aggregator": 0.0},
                         random.Random(0))
        norms[mode] = metrics["adapter/generator/grad_norm"]
    assert norms["scaled"] == pytest.approx(0.75 * norms["full"], rel=1e-5)


def test_released_mini_batches_are_length_balanced_consecutive_cuts(tmp_path: Path, monkeypatch) -> None:
    # Released: the step's sequences in verl's balance_batch order (one rank: by length,
    # short-long-short), cut consecutively, no shuffle; as_written: a shuffle that the
    # update's rng decides. The spy records each mini-batch the update trains.
    from gridrun.train import minibatches
    from gridrun.train import update as update_module

    cell = make_cell(tmp_path, workflow={"name": "orch_workers"}, policy={"name": "shared"},
                     train={"ppo_mini_batch": 1})
    trainer = trainer_for(cell)
    seqs = seqs_for(trainer, ["orchestrator", "worker", "synthesizer"])
    seen: list[list[int]] = []
    real = update_module._minibatch

    def spy(model, batch, *args):
        seen.append([id(s) for s in batch])
        return real(model, batch, *args)

    monkeypatch.setattr(update_module, "_minibatch", spy)
    run_update(trainer, seqs)
    order = minibatches.balanced_order([len(s.prompt_ids) + len(s.completion_ids) for s in seqs], 1, 2)
    expected = [[id(seqs[i]) for i in order[k : k + 2]] for k in range(0, len(seqs), 2)]
    assert seen == expected and len(seen) == 10  # 2 problems x 2 episodes x 5 turns, 2 per cut
    lengths = [len(seqs[i].prompt_ids) + len(seqs[i].completion_ids) for i in order]
    peak = lengths.index(max(lengths))
    assert lengths[: peak + 1] == sorted(lengths[: peak + 1])
    assert lengths[peak:] == sorted(lengths[peak:], reverse=True)
    seen.clear()
    trainer.config = dataclasses.replace(
        trainer.config, grpo=dataclasses.replace(trainer.config.grpo, minibatch_order="shuffled")
    )
    run_update(trainer, seqs)
    shuffled = [id(s) for s in seqs]
    random.Random(0).shuffle(shuffled)
    assert seen == [shuffled[k : k + 2] for k in range(0, len(seqs), 2)]


def test_a_non_finite_loss_skips_the_optimizer_step(tmp_path: Path) -> None:
    # A NaN advantage makes its mini-batch's loss and gradient NaN: no optimizer step (AdamW
    # keeps no state, the LoRA weights stay), the skip is counted; the next batch trains.
    cell = make_cell(tmp_path, workflow={"name": "voting"}, policy={"name": "shared"})
    trainer = trainer_for(cell)
    seqs = seqs_for(trainer, ["generator", "aggregator"])
    for s in seqs:
        s.advantage = float("nan")
    before = snapshot(trainer.model)
    metrics = run_update(trainer, seqs)
    # 2 problems x 2 episodes x 4 turns = 16 sequences in mini-batches of 4 x n=2 = 8: 2 skips.
    assert metrics["train/skipped_nonfinite"] == metrics["adapter/shared/skipped_nonfinite"] == 2
    assert metrics["adapter/shared/opt_steps"] == 0
    assert not changed(before, trainer.model)
    assert not trainer.optimizers["shared"].state
    assert all(math.isfinite(metrics[f"role/{r}/grad_share"]) for r in ("generator", "aggregator"))
    assert run_update(trainer, seqs_for(trainer, ["generator"]))["train/skipped_nonfinite"] == 0
    assert changed(before, trainer.model)


def test_skipped_non_finite_steps_show_as_an_alert(tmp_path: Path, monkeypatch) -> None:
    # Step 1's advantages are NaN (one mini-batch: 4 problems x n=2 in one cut of 8), step 2's
    # are real: state.json counts one skipped step and carries the alert `gridrun status` shows.
    from gridrun.train import trainer as trainer_module

    real = trainer_module.turn_advantages
    calls = []

    def first_step_nan(episodes, *args):
        advantages, stats = real(episodes, *args)
        calls.append(1)
        if len(calls) == 1:
            advantages = [[float("nan")] * len(row) for row in advantages]
        return advantages, stats

    monkeypatch.setattr(trainer_module, "turn_advantages", first_step_nan)
    cell = make_cell(tmp_path, train={"total_steps": 2, "val_every": 1})
    assert run_cell(cell) == 0, RunDir(cell).read_state().to_json().get("error")
    train = [r for r in RunDir(cell).read_metrics() if r["split"] == "train"]
    assert [r["train/skipped_nonfinite"] for r in train] == [1, 0]
    assert [r["adapter/shared/opt_steps"] for r in train] == [0, 1]
    state = RunDir(cell).read_state().to_json()
    assert state["skipped_nonfinite"] == 1
    assert "non_finite: 1 optimizer step skipped" in state["alerts"]


@pytest.mark.parametrize("listed", [None, ["gradient_amplification", "grad_norm_spike"]])
def test_mechanism_alerts_go_to_the_train_rows_and_state(tmp_path: Path, monkeypatch, listed: list[str] | None) -> None:
    # With ppl_factor 0 any known generator perplexity ratio is "amplified" (perplexity is > 0,
    # so every ratio is known): Voting-IP fires from step 1 on, and the trainer logs what a
    # replay of its metrics.jsonl says, row by row. With a 1-step window and factor 0,
    # grad_norm_spike holds from step 2 on (a norm >= 0 x step 1's): live only where
    # train.alert_signals lists it, so the default run neither flags nor records it.
    from gridrun.seam.mechanisms import LIVE_ALERTS, MechanismWatch, Thresholds, alert_flags
    from gridrun.train import trainer as trainer_module

    eager = Thresholds(ppl_factor=0.0, signal_window=1, grad_norm_factor=0.0)
    monkeypatch.setattr(trainer_module, "MechanismWatch", lambda w, p, **kw: MechanismWatch(w, p, eager, **kw))
    cell = make_cell(tmp_path, workflow={"name": "voting"}, policy={"name": "isolated"},
                     train={"total_steps": 2, "val_every": 1, **({"alert_signals": listed} if listed else {})})
    assert run_cell(cell) == 0, RunDir(cell).read_state().to_json().get("error")
    rows = RunDir(cell).read_metrics()
    replay = MechanismWatch("voting", "isolated", eager, signals=listed or LIVE_ALERTS)
    expected = {"alert/gradient_amplification": 1, "alert/sp_role_capture": 0}
    for row in rows:
        seen = replay.see(row)
        if row["split"] == "train":
            flags = alert_flags(seen, replay.flagged)
            spiked = {"alert/grad_norm_spike": int(row["step"] == 2)} if listed else {}
            assert {k: row[k] for k in flags} == flags == {**expected, **spiked}
            assert listed or "alert/grad_norm_spike" not in row
    alerts = RunDir(cell).read_state().to_json()["alerts"]
    assert alerts == seen
    assert [a.split(":")[0] for a in alerts] == ["gradient_amplification", *(["grad_norm_spike"] if listed else [])]


WORKFLOW_ROLES = {
    "eval_opt": ("generator", "evaluator"),
    "voting": ("generator", "aggregator"),
    "orch_workers": ("orchestrator", "worker", "synthesizer"),
}


@pytest.mark.parametrize("policy", ["shared", "isolated"])
@pytest.mark.parametrize("workflow", sorted(WORKFLOW_ROLES))
def test_every_workflow_and_policy_trains_two_steps(tmp_path: Path, workflow: str, policy: str) -> None:
    rounds = {"rounds": 2} if workflow == "eval_opt" else {}
    cell = make_cell(tmp_path, workflow={"name": workflow, **rounds}, policy={"name": policy})
    assert run_cell(cell) == 0, RunDir(cell).read_state().to_json().get("error")
    rows = RunDir(cell).read_metrics()
    train = [r for r in rows if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    for role in WORKFLOW_ROLES[workflow]:
        for metric in ("tokens", "token_share", "grad_share", "grad_norm", "loss", "chi2", "ppl", "entropy",
                       "clip_frac", "len_mean", "trunc_rate", "zero_var_share"):
            assert f"role/{role}/{metric}" in train[-1], (role, metric)
        assert 0.0 <= train[-1][f"role/{role}/zero_var_share"] <= 1.0
    assert {r["step"] for r in rows if r["split"] == "val"} == {0, 2}
    state = RunDir(cell).read_state().to_json()
    assert state["state"] == "done" and state["step"] == 2 and "peak_val_acc" in state
    # `gridrun status` reads the peak's test accuracy from state.json, as its metrics row says.
    assert [state["peak_test_acc"]] == [r["test/acc"] for r in rows if r["split"] == "test"]
    # The rollout and the trainer agree on the sampled tokens' log-probs (same weights).
    assert all(train[0][f"role/{r}/rollout_logp_absdiff"] < 1e-3 for r in WORKFLOW_ROLES[workflow])


# 40 steps and five 400-problem validations: minutes on two cores, so CI's slow step runs it.
@pytest.mark.slow
def test_single_agent_rl_learns(tmp_path: Path) -> None:
    # A gain that lasts: the fragile warm-start checkpoint moves by itself under any update
    # (a random-reward control jumps ~20 points at step 10 and falls back by ~40), so the
    # rise is checked at steps 30 and 40, on 400 validation problems (sd of a rate ~2.4 pts).
    cell = make_cell(
        tmp_path, cell={"kind": "sa_rl"}, lora={"rank": 16, "alpha": 32},
        grpo={"n": 8}, lengths={"max_response_tokens": 32},
        train={"total_steps": 40, "batch_problems": 16, "ppo_mini_batch": 16, "val_every": 10,
               "save_every": 40, "val_problems": 400},
    )
    assert run_cell(cell) == 0
    acc = {r["step"]: r["val/acc"] for r in RunDir(cell).read_metrics() if r["split"] == "val"}
    assert acc[30] >= acc[0] + 0.05 and acc[40] >= acc[0] + 0.05, acc


def _adapters(checkpoint: Path) -> dict[str, torch.Tensor]:
    return {f"{d.name}/{k}": v for d in sorted((checkpoint / "adapters").iterdir()) if d.is_dir()
            for k, v in load_file(d / "adapter_model.safetensors").items()}


def test_kill_and_resume_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    overrides = {"workflow": {"name": "voting"}, "policy": {"name": "isolated"},
                 "train": {"total_steps": 4, "val_every": 2, "save_every": 1, "keep_checkpoints": 2}}
    straight = make_cell(tmp_path, "straight", **overrides)
    assert run_cell(straight) == 0
    killed = twin_cell(tmp_path, "killed", of="straight", **overrides)
    proc = start_run(killed, until_step=2)
    time.sleep(0.3)  # land somewhere inside step 3
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert RunDir(killed).read_state().to_json()["state"] == "running"  # died without a word
    assert run_cell(killed) == 0
    final = RunDir(straight).checkpoint(4)
    a, b = _adapters(final), _adapters(RunDir(killed).checkpoint(4))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert metric_rows(straight) == metric_rows(killed)


def test_a_corrupt_checkpoint_fails_with_the_fix(tmp_path: Path) -> None:
    cell = make_cell(tmp_path, train={"total_steps": 1, "val_every": 1})
    assert run_cell(cell) == 0
    (RunDir(cell).checkpoint(1) / "optimizers.pt").write_bytes(b"garbage")
    (cell / "config.yaml").write_text((cell / "config.yaml").read_text().replace("total_steps: 1", "total_steps: 2"))
    reopen(cell)
    assert run_cell(cell) == 1
    state = RunDir(cell).read_state().to_json()
    assert state["state"] == "failed" and "move it aside" in state["error"]
    assert (RunDir(cell).checkpoint(1) / "adapters").is_dir(), "nothing that was there is lost"


def test_first_mini_batch_skips_the_old_log_prob_pass_without_changing_the_update(tmp_path: Path,
                                                                                  monkeypatch) -> None:
    # Orch-Workers under IP, 4 mini-batches of 2 rows for the worker adapter, 1 for the others.
    # Each adapter's first mini-batch needs no old-log-prob pass (its weights are those of
    # the rollout): the pass sees only the other rows, and the adapters end where a run that
    # recomputes every old log-prob ends (the same maths; float noise of two forwards).
    from gridrun.train import update as update_module

    cell = make_cell(tmp_path, workflow={"name": "orch_workers"}, policy={"name": "isolated"},
                     train={"ppo_mini_batch": 1})
    results = {}
    for name, skip in (("skipping", True), ("recomputing", False)):
        trainer = trainer_for(cell)
        seqs = seqs_for(trainer, ["orchestrator", "worker", "synthesizer"])
        passed: list[int] = []
        real = update_module.fill_reference_logprobs

        def spy(model, old_batches, *args, real=real, passed=passed, skip=skip, seqs=seqs):
            old = [s for batch in old_batches for s in batch]
            # Recomputing: each adapter's first mini-batch (the rows left out) goes through too.
            extra = [] if skip else [[s for s in seqs if s.adapter == adapter and all(s is not o for o in old)]
                                     for adapter in ("orchestrator", "worker", "synthesizer")]
            passed.append(len(old) + sum(map(len, extra)))
            return real(model, old_batches + extra, *args)

        monkeypatch.setattr(update_module, "fill_reference_logprobs", spy)
        metrics = run_update(trainer, seqs)
        results[name] = ({n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n},
                         metrics, passed[0])
    # 2 problems x 2 episodes x 5 turns = 20 sequences; the first cut of each of the three
    # adapters (1 problem x n=2 = 2 rows) needs no pass: 14 of 20 go through it.
    (skip_w, skip_m, skip_n), (full_w, full_m, full_n) = results["skipping"], results["recomputing"]
    assert (full_n, skip_n) == (20, 14)
    for key, value in full_w.items():
        torch.testing.assert_close(skip_w[key], value, rtol=1e-4, atol=1e-3 / 100)
    for key in ("role/worker/loss", "role/worker/entropy", "role/worker/chi2", "role/orchestrator/ppl"):
        assert skip_m[key] == pytest.approx(full_m[key], rel=1e-4, abs=1e-6), key


def test_grader_timeouts_are_counted_in_the_train_rows(tmp_path: Path, monkeypatch) -> None:
    # Every boxed answer's grading "runs past the limit": each scores 0 and is counted.
    from gridrun.tasks import math_grader

    def too_slow(given: str, reference: str) -> bool:
        raise math_grader._Timeout

    monkeypatch.setattr(math_grader, "_grade", too_slow)
    cell = make_cell(tmp_path, train={"total_steps": 1, "val_every": 1})
    assert run_cell(cell) == 0, RunDir(cell).read_state().to_json().get("error")
    train = [r for r in RunDir(cell).read_metrics() if r["split"] == "train"]
    assert len(train) == 1
    assert train[0]["reward/grader_timeouts"] > 0 and train[0]["reward/acc"] == 0.0


def test_a_run_whose_cell_was_queued_again_meanwhile_stops_without_touching_the_new_attempt(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    # A job read lost (no job id recorded) is queued again by `gridrun resubmit --failed`
    # while its trainer still runs: that trainer's next record is refused by the state
    # machine; it stops with one line and leaves the new attempt as queued (issue 30).
    from gridrun.seam import cellstate
    from gridrun.train import trainer as trainer_module

    cell = make_cell(tmp_path, train={"total_steps": 3, "val_every": 1})
    real = trainer_module.turn_advantages
    calls = []

    def resubmitted_during_step_1(episodes, *args):
        calls.append(1)
        if len(calls) == 1:
            record = RunDir(cell).read_state()
            RunDir(cell).record(cellstate.queued(record.with_(state=cellstate.CellState.FAILED, lost=True), "slurm"))
        return real(episodes, *args)

    monkeypatch.setattr(trainer_module, "turn_advantages", resubmitted_during_step_1)
    code = run_cell(cell)
    state = RunDir(cell).read_state().to_json()
    assert code == 1, state
    assert (state["state"], state["attempt"], state["error"]) == ("queued", 1, None)
    assert "queued again" in caplog.text and "Traceback" not in caplog.text


@pytest.mark.parametrize("action", ["stop", "export_peak"])
def test_an_alert_that_acts_exports_the_peak_and_stop_ends_the_cell(tmp_path: Path, monkeypatch, action: str) -> None:
    # As above, Voting-IP's eager perplexity test fires from step 1 on. Under stop the cell
    # ends cleanly after step 1 (state `stopped`, exit 0) with the alert, its step and the
    # peak's adapters exported; under export_peak the same export happens and training goes on.
    from gridrun.seam.mechanisms import MechanismWatch, Thresholds
    from gridrun.train import trainer as trainer_module

    eager = Thresholds(ppl_factor=0.0)
    monkeypatch.setattr(trainer_module, "MechanismWatch", lambda w, p, **kw: MechanismWatch(w, p, eager, **kw))
    if action == "stop":
        # This cell's step-1 validation does not beat step 0's; read the newest validation as
        # the peak, so the peak is a trained checkpoint (saved as a peak is) and is exported.
        monkeypatch.setattr(trainer_module, "first_peak", lambda accs: (max(accs), accs[max(accs)]) if accs else None)
    cell = make_cell(tmp_path, workflow={"name": "voting"}, policy={"name": "isolated"},
                     train={"total_steps": 3, "val_every": 1, "on_alert": action})
    assert run_cell(cell) == 0, RunDir(cell).read_state().to_json().get("error")
    state = RunDir(cell).read_state()
    assert state.on_alert == action and state.alert_step == 1
    assert state.alert is not None and state.alert.startswith("gradient_amplification: generator ")
    steps = sorted({r["step"] for r in RunDir(cell).read_metrics()})
    if action == "stop":
        assert state.state == "stopped" and state.step == 1 and steps == [0, 1]
        # The peak's adapters (one per role under IP), as `gridrun export` writes them.
        exported = Path(str(state.peak_export))
        assert exported == RunDir(cell).export(1) and (exported / "roles.json").is_file()
        assert {p.name for p in exported.iterdir() if p.is_dir()} == {"generator", "aggregator"}
    else:
        assert state.state == "done" and state.step == 3 and steps == [0, 1, 2, 3]
        # The peak at the alert was the base model (step 1 did not beat step 0): nothing to export.
        accs = val_accuracy(RunDir(cell).read_metrics())
        assert accs[1] <= accs[0] and state.peak_export == "base model"


def test_the_trainer_returns_its_cached_memory_between_the_update_and_the_wake(tmp_path: Path, monkeypatch) -> None:
    # The GPU's hand-overs, in the order a CPU run makes them (the CUDA calls are behind
    # return_cached_memory, stubbed here; tests/test_distributed.py checks what it calls): the
    # engine starts after the trainer returned its cache, and every step sleeps the engine,
    # updates, returns the update's cache and only then wakes the engine for the live-adapter
    # proof and the next rollout.
    from gridrun.train import trainer as trainer_module

    calls: list[str] = []
    real_update, real_make_engine = trainer_module.update, trainer_module.make_engine
    monkeypatch.setattr(trainer_module, "return_cached_memory", lambda device: calls.append("return_cached_memory"))
    monkeypatch.setattr(trainer_module, "update", lambda *a, **k: calls.append("update") or real_update(*a, **k))

    def make_engine(*args):
        calls.append("engine starts")
        engine = real_make_engine(*args)
        for name in ("sleep", "wake", "refresh_proven", "generate"):
            method = getattr(engine, name)
            setattr(engine, name, lambda *a, _m=method, _n=name, **k: calls.append(_n) or _m(*a, **k))
        return engine

    monkeypatch.setattr(trainer_module, "make_engine", make_engine)
    cell = make_cell(tmp_path, train={"total_steps": 2, "val_every": 2})
    assert run_cell(cell) == 0, RunDir(cell).read_state().to_json().get("error")
    # Consecutive generate calls (rollout stages; step 0's validation and step 1's rollout) read as one.
    order = [c for i, c in enumerate(calls) if c != "generate" or calls[i - 1] != "generate"]
    step = ["generate", "sleep", "update", "return_cached_memory", "wake", "refresh_proven"]
    # Last, the test evaluation: the peak's adapters served, then its rollout.
    assert order == ["return_cached_memory", "engine starts", "refresh_proven", *step, *step, "generate",
                     "refresh_proven", "generate"]
    # Each step's record holds the GPU memory at every hand-over (None on the CPU).
    last = RunDir(cell).read_rank_records()[0]["steps"][-1]
    assert {k: last[k] for k in last if "gpu_gb" in k or k.startswith("trainer_")} == dict.fromkeys(
        ["free_gpu_gb_awake", "free_gpu_gb_asleep", "free_gpu_gb_updated", "trainer_peak_gb", "free_gpu_gb_released",
         "trainer_kept_gb", "free_gpu_gb_woken"])


@pytest.mark.parametrize(("action", "final"), [("export_peak", "done"), ("stop", "stopped")])
def test_an_alert_whose_export_fails_warns_and_the_action_goes_on(tmp_path: Path, monkeypatch, caplog, action: str,
                                                                  final: str) -> None:
    # exports/ unwritable: the action's side job fails, not the run (every resume would
    # fail the same way): one warning, the peak's checkpoint kept, training goes on or stops.
    import errno
    import logging

    from gridrun.seam.mechanisms import MechanismWatch, Thresholds
    from gridrun.train import trainer as trainer_module

    eager = Thresholds(ppl_factor=0.0)
    monkeypatch.setattr(trainer_module, "MechanismWatch", lambda w, p, **kw: MechanismWatch(w, p, eager, **kw))
    monkeypatch.setattr(trainer_module, "first_peak", lambda accs: (max(accs), accs[max(accs)]) if accs else None)

    def unwritable(run_dir: Any, step: Any, *args: Any, **kwargs: Any) -> Path:
        raise OSError(errno.EACCES, "Permission denied", str(run_dir.export(step)))

    monkeypatch.setattr(trainer_module, "export", unwritable)
    cell = make_cell(tmp_path, workflow={"name": "voting"}, policy={"name": "isolated"},
                     train={"total_steps": 3, "val_every": 1, "on_alert": action})
    with caplog.at_level(logging.WARNING, logger="gridrun"):
        assert run_cell(cell) == 0, RunDir(cell).read_state().to_json().get("error")
    state = RunDir(cell).read_state()
    assert state.state == final and state.on_alert == action and state.alert_step == 1 and state.peak_export is None
    assert "the peak's export failed" in caplog.text and "Permission denied" in caplog.text
    if action == "stop":  # the stop's own checkpoint is the peak's, there to export by hand
        assert RunDir(cell).checkpoint(1).is_dir()


def test_the_collapse_detector_stops_at_the_cliff_its_replay_finds(tmp_path: Path) -> None:
    # LR 0.05 breaks the toy model in one step: 40 validation problems fall from 35% right to
    # none. Paired by problem (14 of -1, 26 of 0) the fall's SE is 7.6 points, z = 4.6, over
    # the bound of 5 planned validations (10 pairs: z >= 2.58): the detector's `collapse`
    # alert, and on_alert=stop ends the cell there with the base model as its peak.
    from gridrun.analysis.warning import warning_columns
    from gridrun.seam.significance import COLLAPSE

    settings = {"total_steps": 4, "val_every": 1, "val_problems": 40}
    cell = make_cell(tmp_path, "stops", optim={"lr": 0.05}, train={**settings, "on_alert": "stop", "fall_alert": True})
    assert run_cell(cell) == 0, RunDir(cell).read_state().to_json().get("error")
    state = RunDir(cell).read_state()
    assert state.state == "stopped" and state.step == 1 and state.peak_export == "base model"
    assert state.alert is not None and state.alert.startswith(f"{COLLAPSE}: validation fell ")
    assert "paired by problem" in state.alert
    # The same cell trained to the end without the detector: the replay collect runs on its
    # validations and records stops where the live detector did (validating leaves training's
    # RNG alone, so the stopped run is the full run's prefix).
    full = make_cell(tmp_path, "full", optim={"lr": 0.05}, train=settings)
    assert run_cell(full) == 0
    run = RunDir(full)
    rows = run.read_metrics()
    assert val_accuracy(rows)[1] == val_accuracy(RunDir(cell).read_metrics())[1]
    replayed = warning_columns(val_accuracy(rows), {}, {r["step"]: r["val/acc_se"] for r in rows if r["split"] == "val"},
                               records=run.read_records("val")[0], validations=5)
    assert replayed["detector_step"] == 1 and replayed["detector_peak_kept"] is True
    # Off by default: the full run has no collapse alert.
    assert not any(a.startswith(COLLAPSE) for a in run.read_state().alerts)
