"""Transfer cells (the paper's Table 3): a finished SA-RL run's adapter serves the generator
inside a multi-agent workflow, every other role runs on the base model, evaluation only.

The SA-RL run dir here is written by the real checkpoint writer, with a random LoRA B so
that the adapter and the base model disagree visibly, even on the shipped world's nearly
certain tokens (peft starts B at zero, where the two would be equal and routing could not
be told apart)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import get_peft_model

from gridrun.adapters import AdapterSourceError, resolve
from gridrun.cellrun import model_files, run_cell
from gridrun.seam.registry import workflow as get_workflow
from gridrun.seam.runconfig import ConfigError, config_from_dict, load_config
from gridrun.seam.rundir import RunDir
from gridrun.train import checkpoint
from gridrun.train.model import load_base
from gridrun.train.policy import SHARED, lora_config, routing_for
from gridrun.train.trainer import Trainer
from tests.conftest import TOY_CELL, make_cell, merge
from tests.states import put_state
from tests.vllm.helpers import peft_logprobs, randomize_lora_b

SA_RL = "sa_rl-toy-arith-s0"
TRANSFER_CELL = {
    "cell": {"kind": "transfer"},
    "policy": {"name": "transfer", "adapters": {"generator": f"../{SA_RL}"}},
}


def finished_sa_rl(root: Path, step: int = 2) -> RunDir:
    """An sa_rl run dir that ended `done` with its final checkpoint at `step`."""
    run_dir = RunDir(make_cell(root, SA_RL, cell={"kind": "sa_rl"}))
    config = load_config(run_dir.config_yaml)
    base, _ = load_base(config.model, model_files(config.model))
    model = get_peft_model(base, lora_config(config), adapter_name=SHARED)
    randomize_lora_b(model, seed=3, scale=0.5)
    checkpoint.save(run_dir, step, model, (SHARED,), {}, {"step": step}, keep=2)
    put_state(run_dir, state="done", step=step, total_steps=step)
    return run_dir


def test_generator_turns_use_the_sa_rl_adapter_and_other_roles_the_base_model(toy_world: Path, tmp_path: Path) -> None:
    finished_sa_rl(tmp_path)
    cell = make_cell(tmp_path, "transfer-voting-toy-arith-s0", workflow={"name": "voting"}, **TRANSFER_CELL)
    config = load_config(cell / "config.yaml")
    trainer = Trainer(config, RunDir(cell), model_files(config.model))
    temperature = config.sampling.val_temperature
    # Seeded: what earlier tests left in torch's generator must not decide the samples.
    torch.manual_seed(0)
    episodes = trainer.rollout(trainer.task.val_problems()[:3], 1, temperature)
    roles = set()
    for turn in (turn for episode in episodes for turn in episode.turns):
        if not turn.completion_ids:
            continue  # a turn that stopped at once has no log-probs to tell the weights apart
        served = torch.tensor(turn.logprobs)
        adapter = peft_logprobs(trainer.model, "generator", turn.prompt_ids, turn.completion_ids, temperature)
        base = peft_logprobs(trainer.model, None, turn.prompt_ids, turn.completion_ids, temperature)
        # The rollout's own log-probs say which weights sampled each turn: equal (float
        # noise) to one forward, far (> 0.01 nats somewhere) from the other.
        expected, other = (adapter, base) if turn.role == "generator" else (base, adapter)
        assert (served - expected).abs().max() < 1e-4, (turn.role, turn.slot)
        assert (served - other).abs().max() > 1e-2, (turn.role, turn.slot)
        roles.add(turn.role)
    assert roles == {"generator", "aggregator"}
    # Nothing learns: no adapter is trainable, so no optimizer exists.
    assert trainer.routing.trainable == () and trainer.optimizers == {}


def test_a_transfer_cell_evaluates_once_and_writes_no_checkpoint(toy_world: Path, tmp_path: Path) -> None:
    finished_sa_rl(tmp_path)
    cell = make_cell(tmp_path, "transfer-eval_opt-toy-arith-s0", workflow={"name": "eval_opt"}, **TRANSFER_CELL)
    assert run_cell(cell) == 0
    run_dir = RunDir(cell)
    state = run_dir.read_state().to_json()
    assert (state["state"], state["total_steps"], state["peak_step"]) == ("done", 0, 0)
    # One validation row at step 0 (n = 1 per problem, like a base cell) and its test, no training rows.
    rows = run_dir.read_metrics()
    assert [(row["split"], row["step"]) for row in rows] == [("val", 0), ("test", 0)]
    assert run_dir.latest_checkpoint() is None and run_dir.samples(0).is_file()


def test_an_unfinished_sa_rl_is_a_one_line_error_naming_the_fix(tmp_path: Path) -> None:
    cell = make_cell(tmp_path, "transfer-voting-toy-arith-s0", workflow={"name": "voting"}, **TRANSFER_CELL)
    with pytest.raises(AdapterSourceError, match="neither a run dir, an export nor a peft adapter folder: plan the cell"):
        resolve(f"../{SA_RL}", "generator", cell)
    source = RunDir(make_cell(tmp_path, SA_RL, cell={"kind": "sa_rl"}))
    put_state(source, state="failed", step=1, total_steps=2)
    with pytest.raises(AdapterSourceError) as err:
        resolve(f"../{SA_RL}", "generator", cell)
    assert str(err.value) == (
        f"adapter source {SA_RL} is failed at step 1/2, not done: finish it first (`gridrun resubmit --cells {SA_RL}`)"
    )
    put_state(source, state="done", step=2)
    with pytest.raises(AdapterSourceError, match="done but has no complete checkpoint: re-run it"):
        resolve(f"../{SA_RL}", "generator", cell)


def test_the_adapter_is_the_newest_complete_checkpoints(toy_world: Path, tmp_path: Path) -> None:
    source = finished_sa_rl(tmp_path, step=1)
    make_cell(tmp_path, "t", workflow={"name": "voting"}, **TRANSFER_CELL)
    assert resolve(f"../{SA_RL}", "generator", tmp_path / "t") == source.checkpoint(1).resolve() / "adapters" / SHARED
    # A newer checkpoint without its COMPLETE marker (a kill mid-save) does not count.
    (source.checkpoint(2) / "adapters" / SHARED).mkdir(parents=True)
    assert resolve(f"../{SA_RL}", "generator", tmp_path / "t") == source.checkpoint(1).resolve() / "adapters" / SHARED


def test_transfer_kind_and_policy_go_together() -> None:
    def config(**overrides: object) -> None:
        config_from_dict(merge(TOY_CELL, {"workflow": {"name": "voting"}, **overrides}))

    config(**TRANSFER_CELL)  # accepted
    config(cell={"kind": "eval"}, policy=TRANSFER_CELL["policy"])  # accepted
    with pytest.raises(ConfigError, match="cell.kind=train with policy.name=transfer: .* set policy.name=transfer"):
        config(policy=TRANSFER_CELL["policy"])
    with pytest.raises(ConfigError, match="cell.kind=transfer with policy.name=shared"):
        config(cell={"kind": "transfer"})
    with pytest.raises(ConfigError, match="cell.kind=eval with policy.name=shared"):
        config(cell={"kind": "eval"})
    with pytest.raises(ConfigError, match=r"needs policy.adapters=\{<role>: <run dir, export, peft folder or cell id>"):
        config(cell={"kind": "transfer"}, policy={"name": "transfer"})
    with pytest.raises(ConfigError, match="policy.adapters is for transfer and eval cells .* not isolated: drop it"):
        config(policy={"name": "isolated", "adapters": {"generator": "x"}})
    with pytest.raises(ConfigError, match="multi-agent workflow"):
        config(**TRANSFER_CELL, workflow={"name": "single"})
    # An eval cell names the roles it means: a typo is refused with the closest role.
    with pytest.raises(ConfigError, match="policy.adapters: 'agregator' is not a role of voting .did you mean 'aggregator'"):
        config(cell={"kind": "eval"}, policy={"name": "transfer", "adapters": {"agregator": "x"}})


def test_only_the_generator_is_routed_to_the_adapter_and_orch_workers_has_none(toy_world: Path, tmp_path: Path) -> None:
    source = finished_sa_rl(tmp_path)

    def routes(workflow: str) -> dict[str, str | None]:
        config = config_from_dict(merge(TOY_CELL, {"workflow": {"name": workflow}, **TRANSFER_CELL}))
        routing = routing_for(config, get_workflow(workflow), tmp_path / "transfer")
        assert routing.frozen == ({"generator": source.checkpoint(2).resolve() / "adapters" / SHARED}
                                  if "generator" in routing.role_adapter else {})
        return routing.role_adapter

    assert routes("eval_opt") == {"generator": "generator", "evaluator": None}
    assert routes("voting") == {"generator": "generator", "aggregator": None}
    # The paper's reading: Orch-Workers has no generator, so its orchestrator, workers and
    # synthesizer all "fall through to the base model" (Appendix A.2).
    assert routes("orch_workers") == {"orchestrator": None, "worker": None, "synthesizer": None}
