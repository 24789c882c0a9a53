"""Policy routing: which LoRA adapter serves and learns from each role.

- shared   (SP): every role -> one adapter.
- isolated (IP): one adapter per role *type*; same-role slots (3 voters, 3 workers) share it.
- single-agent RL (kind sa_rl): the generator -> one adapter.
- base (kind base): every role -> the base model, no adapter.
- transfer (kind transfer): one role -> a trained adapter loaded frozen; every other role ->
  the base model (the SA-RL generator transplanted into a workflow, the paper's Table 3).
  A workflow without that role (Orch-Workers has no generator) runs wholly on the base
  model, as the paper's did: its text lists worker and synthesizer among the base roles.
  The adapter comes from a finished run dir, resolved when the cell runs
  (`transfer_adapter_dir`): that run's newest complete checkpoint, its adapter for the role.

Base weights are frozen. peft's `set_adapter` turns off requires_grad on inactive adapters,
so the update code activates one adapter, forwards and backpropagates only its
sequences, then moves on: never one summed loss over two adapters.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model

from gridrun.registry import Workflow
from gridrun.runconfig import ConfigError, RunConfig, load_config
from gridrun.rundir import RunDir
from gridrun.train import checkpoint

SHARED = "shared"
TRANSFER = "transfer"

log = logging.getLogger("gridrun")


@dataclass(frozen=True)
class Routing:
    # role -> adapter name, None = base model.
    role_adapter: dict[str, str | None]
    # Adapters that learn (each gets its own optimizer).
    trainable: tuple[str, ...]

    def adapter(self, role: str) -> str | None:
        return self.role_adapter[role]

    def roles_of(self, adapter: str) -> list[str]:
        return [r for r, a in self.role_adapter.items() if a == adapter]


def routing_for(config: RunConfig, workflow: Workflow) -> Routing:
    roles = workflow.roles
    if config.cell.kind == "base":
        return Routing({r: None for r in roles}, ())
    if config.cell.kind == "transfer":
        if config.policy.transfer_role not in roles:
            # As the paper's Table 3: its Orch-Workers has no generator, so every role there
            # (orchestrator, workers, synthesizer) fell through to the base model.
            log.warning(
                "transfer: %s has no %s role, so every role runs on the base model", workflow.name,
                config.policy.transfer_role,
            )
        return Routing({r: TRANSFER if r == config.policy.transfer_role else None for r in roles}, ())
    if config.policy.name == "shared" or len(roles) == 1:
        return Routing({r: SHARED for r in roles}, (SHARED,))
    return Routing({r: r for r in roles}, tuple(roles))


def lora_config(config: RunConfig) -> LoraConfig:
    spec = config.lora
    return LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=spec.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )


class TransferSourceError(ValueError):
    """The adapter a transfer cell needs is missing or not finished; the message names the fix."""


def transfer_adapter_dir(config: RunConfig, run_dir: Path | None = None) -> Path:
    """The peft adapter dir that serves `policy.transfer_role`.

    `policy.transfer_adapter` names a peft adapter dir, or the run dir of a finished cell
    (relative paths from `run_dir`): then its newest complete checkpoint's adapter of that role."""
    named = Path(str(config.policy.transfer_adapter))
    path = (run_dir / named).resolve() if run_dir is not None and not named.is_absolute() else named
    if (path / "adapter_config.json").is_file():
        return path
    source = RunDir(path)
    if not source.config_yaml.is_file():
        raise TransferSourceError(
            f"transfer source {path} is neither a run dir nor a peft adapter dir: plan its sa_rl cell "
            "(kind=sa_rl in the same sweep) or point policy.transfer_adapter at an adapter"
        )
    state = source.read_state()
    if state.get("state") != "done":
        raise TransferSourceError(
            f"transfer source {path.name} is {state.get('state')} at step {state.get('step', 0)}/"
            f"{state.get('total_steps', '?')}, not done: finish it first (`gridrun resubmit --cells {path.name}`)"
        )
    latest = source.latest_checkpoint()
    if latest is None:
        raise TransferSourceError(f"transfer source {path.name} is done but has no complete checkpoint: re-run it")
    try:
        source_config = load_config(source.config_yaml)
    except ConfigError as err:
        raise TransferSourceError(f"transfer source {path.name}: {err}") from None
    role = config.policy.transfer_role
    source_routing = routing_for(source_config, source_config.workflow_entry())
    adapter = source_routing.role_adapter.get(role)
    if adapter is None:
        raise TransferSourceError(
            f"transfer source {path.name} trained no adapter for role '{role}' "
            f"(its roles: {', '.join(source_routing.role_adapter)}): point policy.transfer_adapter at a cell that did"
        )
    found = checkpoint.adapter_dir(latest[1], adapter)
    if not (found / "adapter_config.json").is_file():
        raise TransferSourceError(f"{latest[1]} lacks adapter '{adapter}': its checkpoint is damaged, re-run the cell")
    return found


def attach_adapters(base: Any, config: RunConfig, routing: Routing, run_dir: Path | None = None) -> Any:
    """Wrap the base model with the routing's adapters; returns the model to roll out and train.
    `run_dir` is the cell's own (a transfer cell's source is named relative to it)."""
    if config.policy.name == "transfer":
        found = transfer_adapter_dir(config, run_dir)
        if routing.roles_of(TRANSFER):
            log.info("transfer: %s runs on the adapter in %s, other roles on the base model", config.policy.transfer_role, found)
        return PeftModel.from_pretrained(base, str(found), adapter_name=TRANSFER, is_trainable=False)
    if not routing.trainable:
        return base
    torch.manual_seed(config.cell.seed)  # LoRA A init: same per seed, whatever else ran before
    first, *rest = routing.trainable
    model = get_peft_model(base, lora_config(config), adapter_name=first)
    for name in rest:
        model.add_adapter(name, lora_config(config))
    return model


def adapter_parameters(model: Any, adapter: str) -> dict[str, torch.nn.Parameter]:
    """The LoRA parameters of one adapter, by name."""
    return {n: p for n, p in model.named_parameters() if f".{adapter}." in n and "lora_" in n}


def activate(model: Any, adapter: str) -> None:
    """Make `adapter` the active, trainable one (and only it)."""
    model.set_adapter(adapter)
    for name, param in model.named_parameters():
        if "lora_" in name:
            param.requires_grad_(f".{adapter}." in name)
