"""Policy routing: which LoRA adapter serves and learns from each role.

- shared   (SP): every role -> one adapter.
- isolated (IP): one adapter per role *type*; same-role slots (3 voters, 3 workers) share it.
- grouped: one adapter per group of `policy.groups`, named after it (partial sharing, e.g.
  Orch-Workers' orchestrator and synthesizer on one, its workers on another); shared and
  isolated are its two extreme cases (gridrun/seam/routing.py's adapter_groups says which
  roles each adapter serves, for every policy).
- single-agent RL (kind sa_rl): the generator -> one adapter.
- base (kind base): every role -> the base model, no adapter.
- transfer (kinds transfer and eval): each role named in `policy.adapters` (or every role,
  through its `all_roles` key) -> a trained adapter loaded frozen, found when the cell runs
  (gridrun/adapters.py); every other role -> the base model. Roles whose sources resolve
  to the same folder share one adapter, named after the first of them (so an eval cell
  batches its roles as the trained cell did). Table 3's transfer cell names the SA-RL run
  for the generator;
  a workflow without that role (Orch-Workers has no generator) runs wholly on the base
  model, as the paper's did: its text lists worker and synthesizer among the base roles.

Base weights are frozen. peft's `set_adapter` turns off requires_grad on inactive adapters,
so the update code activates one adapter, forwards and backpropagates only its
sequences, then moves on: never one summed loss over two adapters.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model

from gridrun.adapters import resolve
from gridrun.seam.registry import Workflow
from gridrun.seam.routing import Routing, trained_routing
from gridrun.seam.runconfig import ALL_ROLES, SHARED_ADAPTER, RunConfig

SHARED = SHARED_ADAPTER
TRANSFER = "transfer"

log = logging.getLogger("gridrun")


def routing_for(config: RunConfig, workflow: Workflow, run_dir: Path | None = None) -> Routing:
    """`run_dir`: the cell's own, from which relative adapter sources are taken (transfer)."""
    if config.policy.name == TRANSFER:
        return _frozen_routing(config, workflow, run_dir)
    return trained_routing(config)


def _frozen_routing(config: RunConfig, workflow: Workflow, run_dir: Path | None) -> Routing:
    missing = [role for role in config.policy.adapters if role not in (*workflow.roles, ALL_ROLES)]
    if missing:
        # As the paper's Table 3: its Orch-Workers has no generator, so every role there
        # (orchestrator, workers, synthesizer) fell through to the base model.
        log.warning("%s: %s has no %s role, so it runs on the base model", config.cell.kind, workflow.name, " or ".join(missing))
    named = config.policy.adapters
    sources = {r: named.get(r, named.get(ALL_ROLES)) for r in workflow.roles}
    folders = {role: resolve(source, role, run_dir) for role, source in sources.items() if source is not None}
    names: dict[Path, str] = {}
    for role in workflow.roles:
        if role in folders:
            names.setdefault(folders[role], role)
    role_adapter = {r: names[folders[r]] if r in folders else None for r in workflow.roles}
    return Routing(role_adapter, (), {name: folder for folder, name in names.items()})


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


def attach_adapters(base: Any, config: RunConfig, routing: Routing) -> Any:
    """Wrap the base model with the routing's adapters; returns the model to roll out and train."""
    if routing.frozen:
        model = None
        for name, folder in routing.frozen.items():
            for role in routing.roles_of(name):
                log.info("%s: %s runs on the adapter in %s", config.cell.kind, role, folder)
            if model is None:
                model = PeftModel.from_pretrained(base, str(folder), adapter_name=name, is_trainable=False)
            else:
                model.load_adapter(str(folder), adapter_name=name, is_trainable=False)
        return model
    if not routing.trainable:
        return base
    torch.manual_seed(config.cell.seed)  # LoRA A init: same per seed, whatever else ran before
    first, *rest = routing.trainable
    model = get_peft_model(base, lora_config(config), adapter_name=first)
    for name in rest:
        model.add_adapter(name, lora_config(config))
    return model


def _owned_by(adapter: str) -> re.Pattern[str]:
    """peft names an adapter's parameters `<module>.lora_<A|B|...>.<adapter>[.weight]`: match
    that part exactly, so a group's name that is also a module's (`mlp`) takes no other's."""
    return re.compile(rf"\.lora_\w+?\.{re.escape(adapter)}(\.|$)")


def adapter_parameters(model: Any, adapter: str) -> dict[str, torch.nn.Parameter]:
    """The LoRA parameters of one adapter, by name."""
    owned = _owned_by(adapter)
    return {n: p for n, p in model.named_parameters() if owned.search(n)}


def switch_adapter(model: Any, adapter: str) -> Any:
    """Make `adapter` peft's active one; returns the one active before. peft's set_adapter
    walks every module (and sets requires_grad), so an adapter already active is left alone."""
    previous = model.active_adapter
    if previous != adapter:
        model.set_adapter(adapter)
    return previous


def activate(model: Any, adapter: str) -> None:
    """Make `adapter` the active, trainable one (and only it)."""
    switch_adapter(model, adapter)
    owned = _owned_by(adapter)
    for name, param in model.named_parameters():
        if "lora_" in name:
            param.requires_grad_(bool(owned.search(name)))
