"""The registries' own checks (gridrun/seam/registry.py): what a registration or a lookup refuses."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from gridrun.seam import registry
from gridrun.seam.registry import ConfigError, Workflow, WorkflowParams
from gridrun.workflows.voting import run as voting_run


@dataclass
class OtherVotingParams(WorkflowParams):
    name: str = "voting"


def test_a_name_taken_by_another_module_is_refused_and_the_first_kept() -> None:
    with pytest.raises(ConfigError, match="workflow 'voting' is registered twice .*: rename one"):
        registry.register_workflow(Workflow(name="voting", roles=("generator",), params=OtherVotingParams, run=voting_run))
    assert registry.workflow("voting").params.__module__ == "gridrun.workflows.voting"


def test_a_parallel_role_must_be_one_of_the_roles() -> None:
    with pytest.raises(ConfigError, match="parallel_role 'voter' is not one of its roles"):
        registry.register_workflow(Workflow(name="bad_parallel", roles=("generator", "aggregator"),
                                            params=OtherVotingParams, run=voting_run, parallel_role="voter"))
    assert "bad_parallel" not in registry.workflow_names()


def test_plugins_that_cannot_load_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="plugin 'no_such_module_xyz' cannot be imported .*PYTHONPATH"):
        registry.workflow("debate", "no_such_module_xyz")
    with pytest.raises(ConfigError, match="does not exist: fix the path"):
        registry.workflow("debate", str(tmp_path / "missing.py"))
    # A module that exists but fails while importing: one line naming it, nothing half-loaded.
    (tmp_path / "broken.py").write_text("def broken(:\n")
    (tmp_path / "needs_more.py").write_text("import no_such_dependency_xyz\n")
    before = set(sys.modules)
    with pytest.raises(ConfigError, match=r"^plugin '.*broken.py' failed while importing \(SyntaxError: .*\): fix that module$"):
        registry.workflow("debate", str(tmp_path / "broken.py"))
    with pytest.raises(ConfigError, match=r"^plugin '.*needs_more.py' failed while importing \(ModuleNotFoundError: "
                                          r"No module named 'no_such_dependency_xyz'\): fix that module$"):
        registry.workflow("debate", str(tmp_path / "needs_more.py"))
    # sys.exit(3) at import: `gridrun plan` exited 3 with no word (SystemExit is no Exception).
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(ConfigError, match=r"^plugin '.*exits.py' failed while importing \(SystemExit: 3\): fix that module$"):
        registry.workflow("debate", str(tmp_path / "exits.py"))
    assert set(sys.modules) == before


def test_built_in_slots_and_prompts_come_from_each_workflows_entry() -> None:
    # One entry per workflow replaces the old WORKFLOW_ROLES / PARALLEL_ROLES maps.
    voting, orch, eval_opt = registry.workflow("voting"), registry.workflow("orch_workers"), registry.workflow("eval_opt")
    assert (voting.roles, voting.parallel_role, voting.slots(voting.params(n_voters=5))) == (("generator", "aggregator"), "generator", 5)
    assert (orch.roles, orch.parallel_role, orch.slots(orch.params())) == (("orchestrator", "worker", "synthesizer"), "worker", 3)
    assert (eval_opt.parallel_role, eval_opt.slots(eval_opt.params()), eval_opt.prompt_names()) == (
        None, 1, ("generator", "evaluator", "revision", "evaluator_followup", "revision_followup"))
    # Every built-in task writes a prompt for every built-in workflow's roles (other tests
    # register plugin options in this process too: they are left out).
    tasks = [t for t in registry.task_names() if registry.task(t).params.__module__.startswith("gridrun.")]
    workflows = [w for w in registry.workflow_names() if registry.workflow(w).params.__module__.startswith("gridrun.")]
    assert (tasks, workflows) == (["arith", "code", "math"], ["eval_opt", "orch_workers", "single", "voting"])
    for task in tasks:
        for name in workflows:
            assert set(registry.workflow(name).prompt_names()) <= registry.task(task).prompt_names()
