"""A GPU cluster's install (issue 30, item 2): the paths jobs share, checked at submission; a
GPU cell that sees no GPU stops at once, naming why; errors name commands that exist.

Before: a GPU cell whose torch could not see a GPU fell back to gloo on the CPU and died much
later inside vLLM; a venv, results root or HF_HOME under /tmp was found out by every job on
another node; errors named `pip install 'gridrun[vllm]'`, and gridrun is not on PyPI.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from gridrun.grid import REPO_ROOT
from gridrun.grid.errors import GridError
from gridrun.grid.launchers import slurm
from gridrun.grid.launchers.cluster import cluster_spec
from gridrun.grid.launchers.slurm import SlurmLauncher, check_shared, node_local
from gridrun.grid.sweepdir import SweepDir
from gridrun.seam.rundir import RunDir
from tests.grid.conftest import Gridrun


def test_a_gpu_cell_that_sees_no_gpu_fails_at_once_naming_why(gridrun: Gridrun, tmp_path: Path) -> None:
    import torch

    # A paper cell as planned for the cluster (0.6B on a 2-GPU L40S node), with random weights
    # so that no checkpoint is needed; run here, where torch sees no GPU.
    results = tmp_path / "results"
    planned = gridrun("plan", "conf=full_matrix", "scale=0.6b", "task=math", "kind=base",
                      "model.init=random", "engine=hf", "engine.max_batch_size=4", "--results-dir", str(results))
    assert planned.code == 0, planned.err
    cell = RunDir(results / "full_matrix" / "cells" / "base-single-0.6b-math")
    assert cell.planned_count("gpus") == 2 and cell.gpus_to_train_on() == 2
    # The old code built the random 0.6B on the CPU and went on to validate (minutes, then
    # vLLM's death on a real node): the timeout would end it.
    run = subprocess.run([sys.executable, "-m", "gridrun.cli", "run", str(cell.root)], capture_output=True, text=True,
                         timeout=300, check=False, cwd=REPO_ROOT)
    assert run.returncode == 1, run.stderr[-2000:]
    state = cell.read_state().to_json()
    assert state["state"] == "failed"
    assert "this cell was planned for 2 GPU(s) but" in state["error"] and "plan it with gpu=cpu" in state["error"]
    assert len(state["error"].splitlines()) == 1
    if torch.version.cuda is None:  # this machine's torch: the CPU wheel
        assert f"its torch {torch.__version__} is a CPU-only build" in state["error"]
        assert "make install-cluster" in state["error"]
    assert not cell.metrics_jsonl.exists()


def test_the_refusals_advice_gpu_cpu_plans_and_runs_a_real_architecture_cell_here(gridrun: Gridrun,
                                                                                  tmp_path: Path) -> None:
    # The cell above planned as its refusal says (gpu=cpu): no GPU asked for, and it runs
    # here. Qwen3-0.6B's class cut to 2 layers and 8-token responses keeps the fast suite fast
    # (the whole 0.6B: docs/real-scale.md). A base cell has no adapters: the trainer enabled
    # gradient checkpointing through peft's wrapper and died on it.
    results = tmp_path / "results"
    planned = gridrun("plan", "conf=full_matrix", "scale=0.6b", "task=math", "kind=base", "model.init=random",
                      "engine=hf", "gpu=cpu", "+model.arch_overrides.num_hidden_layers=2",
                      "lengths.max_response_tokens=8", "train.val_problems=2", "--results-dir", str(results))
    assert planned.code == 0, planned.err
    cell = RunDir(results / "full_matrix" / "cells" / "base-single-0.6b-math")
    assert cell.planned_count("gpus") is None and cell.gpus_to_train_on() == 0
    run = subprocess.run([sys.executable, "-m", "gridrun.cli", "run", str(cell.root)], capture_output=True, text=True,
                         timeout=300, check=False, cwd=REPO_ROOT)
    assert run.returncode == 0, cell.read_state().to_json().get("error") or run.stderr[-2000:]
    val, test = cell.read_metrics()
    # One validation and its test, every response at its 8-token limit (a random model never stops).
    assert test["split"] == "test" and val["split"] == "val" and val["val/role/generator/len_mean"] == 8 and cell.read_state().state == "done"
    assert "hidden_size: 1024" not in cell.config_yaml.read_text()  # published sizes stay out, overrides in
    assert "num_hidden_layers: 2" in cell.config_yaml.read_text()


def test_gpus_asked_for_their_binding_only_are_not_required_by_the_trainer(gridrun: Gridrun, tmp_path: Path) -> None:
    # `gridrun canary --cpu` on a SLURM profile: the job asks for its GPUs (the binding is what
    # it checks) and cell.json says the trainer runs on the CPU.
    results = tmp_path / "results"
    planned = gridrun("plan", "conf=canary", "cluster=testcluster", "launcher=slurm", "model.init=random", "engine=hf",
                      "engine.max_batch_size=4", "+grid.gpu.binding_only=true", "--results-dir", str(results))
    assert planned.code == 0, planned.err
    (cell,) = [RunDir(p) for p in (results / "canary" / "cells").iterdir()]
    assert cell.planned_count("gpus") == 2 and cell.gpus_to_train_on() == 0


def shared_storage(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where this checkout, its venv and the test's folders sit must not decide a test (a fresh
    clone under /tmp is node-local): every path is taken as on NFS except those under
    /srv/ram, a tmpfs, and the venv's python is taken to be on shared storage."""
    monkeypatch.setattr(slurm, "_mount_type", lambda path: "tmpfs" if path.is_relative_to("/srv/ram") else "nfs4")
    monkeypatch.setattr(sys, "executable", "/shared/gridrun/.venv/bin/python")


def test_node_local_paths_are_named_and_shared_ones_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    shared_storage(monkeypatch)
    monkeypatch.delenv("TMPDIR", raising=False)
    assert node_local(Path("/tmp/results")) == "under /tmp"
    assert node_local(Path("/dev/shm/hf")) == "under /dev/shm"
    assert node_local(Path("/srv/ram/results")) == "on a tmpfs filesystem"
    assert node_local(Path("/shared/results")) is None
    monkeypatch.setenv("TMPDIR", "/srv/scratch")
    assert node_local(Path("/srv/scratch/venv")) == "under /srv/scratch"

    shared = Path("/shared/gridrun-results")
    cluster = cluster_spec({"name": "mine"})
    check_shared(shared, cluster, {"HF_HOME": "/shared/hf"})  # passes
    with pytest.raises(GridError, match=r"the results root \(--results-dir\) is /tmp/x, under /tmp: a job on a compute "
                                        r"node cannot see it.*check_shared_paths: false in conf/cluster/mine.yaml"):
        check_shared(Path("/tmp/x"), cluster, {})
    with pytest.raises(GridError, match=r"^HF_HOME .* is /dev/shm/hf, under /dev/shm"):
        check_shared(shared, cluster, {"HF_HOME": "/dev/shm/hf"})
    with pytest.raises(GridError, match=r"^model_dirs' folder of Qwen/Qwen3-4B is /tmp/m"):
        check_shared(shared, cluster_spec({"name": "mine", "model_dirs": {"Qwen/Qwen3-4B": "/tmp/m"}}), {})


def test_submitting_from_a_node_local_results_root_is_refused_before_anything_is_queued(
    gridrun: Gridrun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'sbatch.log'}\nexit 0\n")  # --test-only accepts all
    sbatch.chmod(0o755)
    (bin_dir / "srun").symlink_to(sbatch)  # submitit looks for it; the login node never runs it
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    shared_storage(monkeypatch)
    # The test's folder is node-local wherever it sits: it is this process's TMPDIR.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    results = tmp_path / "results"
    assert gridrun("plan", "conf=full_matrix", "scale=1.7b", "task=math", "workflow=voting", "policy=isolated",
                       "kind=train", "cluster=paper", "launcher=slurm", "--results-dir", str(results)).code == 0
    sweep = SweepDir(results, "full_matrix")
    with pytest.raises(GridError, match=rf"^the results root \(--results-dir\) is {re.escape(str(results))}/full_matrix, under /"):
        SlurmLauncher({"name": "slurm"}).admit(sweep, sweep.cell_ids())
    assert all("--test-only" in line for line in (tmp_path / "sbatch.log").read_text().splitlines())
    # The single-node test cluster's /tmp is every job's.
    assert cluster_spec({"name": "testcluster", "check_shared_paths": False}).check_shared_paths is False


def test_errors_name_install_commands_that_exist() -> None:
    """gridrun is installed from its checkout: an error that names `pip install 'gridrun[...]'`
    names a package no index has, and every `make <target>` an error names must exist."""
    sources = "\n".join(p.read_text() for p in (REPO_ROOT / "gridrun").rglob("*.py"))
    assert not re.findall(r"pip install '?gridrun\[", sources)
    targets = set(re.findall(r"^([a-z0-9-]+):", (REPO_ROOT / "Makefile").read_text(), re.MULTILINE))
    named = set(re.findall(r"`make ([a-z0-9-]+)", sources)) | set(re.findall(r"\bor make ([a-z0-9-]+)", sources))
    assert "install-cluster" in named and named <= targets, named - targets
    from gridrun.train.engines import vllm_engine

    # engine=vllm without vLLM: the message names the cluster install.
    if sys.modules.get("vllm") is None:
        try:
            import vllm  # noqa: F401
        except ImportError:
            with pytest.raises(RuntimeError, match=r"in gridrun's checkout, `make install-cluster`"):
                vllm_engine(None, None, None, ())  # type: ignore[arg-type]


def test_make_install_cluster_refuses_a_node_local_venv(tmp_path: Path) -> None:
    out = subprocess.run(["make", "--no-print-directory", "install-cluster", f"VENV={tmp_path / 'venv'}"],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=60, check=False)
    if node_local(tmp_path) is not None:
        assert out.returncode != 0 and f"{tmp_path / 'venv'} is {node_local(tmp_path)}" in out.stderr
        assert not (tmp_path / "venv").exists()
    # The target and its help line exist.
    assert "make install-cluster" in subprocess.run(["make", "help"], capture_output=True, text=True, cwd=REPO_ROOT,
                                                    timeout=60, check=False).stdout
