"""Bad input: a one-line error naming the fix, exit code 2, no traceback, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.grid.conftest import Gridrun, tree


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # Unknown axis values: the closest valid name, or the valid names.
        (["plan", "conf=smoke", "workflow=votng"], "unknown workflow 'votng' (did you mean 'voting'?)"),
        (["plan", "conf=full_matrix", "task=maths"], "unknown task 'maths' (did you mean 'math'?)"),
        (["plan", "conf=full_matrix", "scale=2b"], "unknown scale '2b'"),
        (["plan", "conf=smoke", "policy=isolate"], "unknown policy 'isolate' (did you mean 'isolated'?)"),
        (["plan", "conf=smoke", "kind=trian"], "unknown kind 'trian' (did you mean 'train'?)"),
        (["plan", "conf=smoke", "engine=vlm"], "unknown engine 'vlm' (did you mean 'vllm'?)"),
        # A typo'd key.
        (["plan", "conf=smoke", "train.totl_steps=3"], "unknown config key 'train.totl_steps' (did you mean 'train.total_steps'?)"),
        # A workflow's own key is set on the cells of the workflows that have it; one that none has is a typo.
        (["plan", "conf=smoke", "workflow.n_voter=5"], ("no cell of the sweep has 'workflow.n_voter' (did you mean "
         "'workflow.n_voters'?); a setting of one workflow's own key applies to the cells of the workflows that have "
         "it (eval_opt, orch_workers, single, voting planned)")),
        (["plan", "conf=smoke", "trian.total_steps=3"], "(did you mean 'train.total_steps'?)"),
        # A wrong type, caught by the trainer's schema before anything is written.
        (["plan", "conf=smoke", "train.total_steps=ten"], "train.total_steps: expected an integer"),
        # Empty axes.
        (["plan", "conf=smoke", "seed=[]"], "axis 'seed' is empty: give it at least one value (e.g. seed=0)"),
        (["plan", "conf=smoke", "workflow="], "axis 'workflow' is empty"),
        (["plan", "conf=smoke", "seed=a"], "seed 'a' is not an integer"),
        # A missing sweep.
        (["plan", "conf=smoke_test"], "no sweep 'smoke_test'"),
        (["plan", "conf=ful_matrix"], "(did you mean 'full_matrix'?)"),
        (["plan", "train.total_steps=2"], "say which sweep: conf=<name>"),
        # Pairings the toy world does not have.
        (["plan", "conf=full_matrix", "scale=toy"], "set task=arith"),
        (["plan", "conf=smoke", "scale=1.7b"], "set scale=toy"),
        (["plan", "conf=smoke", "gpu=h100"], "scale=toy does not run on gpu=h100"),
        # The toy model without its recipe, a recipe on a real model, a recipe key on a real scale.
        (["plan", "conf=full_matrix", "scale=1.7b", "model.name_or_path=toy"],
         "model.name_or_path=toy needs the toy world's recipe under model.toy: pick the model with scale=toy"),
        (["plan", "conf=smoke", "model.name_or_path=Qwen/Qwen3-1.7B"],
         "model.toy is the toy world's recipe, but model.name_or_path is 'Qwen/Qwen3-1.7B'"),
        (["plan", "conf=full_matrix", "scale=1.7b", "model.toy.seed=1"], "unknown config key 'model.toy.seed'"),
        # Sweeping a setting (cells would share ids), or setting what the grid sets.
        (["plan", "conf=smoke", "optim.lr=1e-4,1e-3"], "only the axes"),
        (["plan", "conf=smoke", "cell.seed=3"], "cell.* is set by the grid"),
        (["plan", "conf=smoke", "workflow=single"], "drop it from workflow="),
        (["plan", "conf=smoke", "seed=0,0"], "lists '0' twice"),
        # A cell with a phase its GPU class's usable memory cannot hold (gridrun/memory.py).
        (["plan", "conf=full_matrix", "scale=4b", "gpu=l40s", "train.micro_token_budget=200000"],
         ("cell eval_opt-ip-4b-math-s0 cannot fit on l40s: its update phase needs 89.3 GiB per GPU of 44.4 usable "
          "(trainer 86.6 (weights 7.5, adapters 3.4, activations 70.3, logits 4.6), engine asleep 0.7, CUDA contexts "
          "2.0): lower train.micro_token_budget (now 200000), or pick a larger gpu=")),
        (["plan", "conf=full_matrix", "scale=1.7b", "engine.gpu_memory_utilization=0.95"],
         "lower engine.gpu_memory_utilization (now 0.95; at most 0.90 fits), or pick a larger gpu="),
        # A plugin's name, checked at plan time without importing torch (or the module).
        (["plan", "conf=smoke", "grpo.estimator=gpro"], "grpo.estimator: no advantage estimator 'gpro' (built in: grpo, "),
        (["plan", "conf=smoke", "grpo.estimator=mylab.nowhere:centred"], "module 'mylab.nowhere' cannot be found"),
        (["plan", "conf=smoke", "grpo.policy_loss=vanila"], "grpo.policy_loss: no policy loss 'vanila' (built in: vanilla)"),
        # Syntax.
        (["plan", "conf=smoke", "train.total_steps=[1"], "cannot parse override 'train.total_steps=[1'"),
        # Commands on sweeps that do not exist, and their own options.
        (["status", "conf=nope"], "no sweep 'nope'"),
        (["resubmit", "conf=smoke", "--failed"], "no sweep 'smoke'"),
        (["cancel"], "gridrun cancel needs conf=<sweep>"),
        (["collect", "conf=nope"], "no sweep 'nope'"),
        (["show", "voting-ip-toy-arith-s0"], "no cell 'voting-ip-toy-arith-s0'"),
        (["status", "train.total_steps=3"], "gridrun status takes conf=<sweep> and options"),
    ],
)
def test_bad_input_names_the_fix(gridrun: Gridrun, results: Path, args: list[str], expected: str) -> None:
    result = gridrun(*args)
    assert result.code == 2, result.out
    assert result.err.startswith("gridrun: error: ")
    assert expected in result.err, result.err
    assert "Traceback" not in result.err + result.out
    assert not results.exists() or tree(results) == [], tree(results)


def test_a_sweeps_own_directory_is_not_a_results_root(gridrun: Gridrun, results: Path) -> None:
    assert gridrun("plan", "conf=smoke").code == 0
    before = tree(results)
    result = gridrun("plan", "conf=full_matrix", "--results-dir", str(results / "smoke"))
    assert result.code == 2 and f"pass its parent (--results-dir {results})" in result.err
    assert tree(results) == before


def test_a_results_dir_holding_another_sweep_is_refused(gridrun: Gridrun, results: Path) -> None:
    assert gridrun("plan", "conf=smoke").code == 0
    (results / "smoke").rename(results / "full_matrix")
    before = tree(results)
    for args in (["plan", "conf=full_matrix", "scale=0.6b"], ["status", "conf=full_matrix"]):
        result = gridrun(*args)
        assert result.code == 2 and "holds sweep 'smoke', not 'full_matrix'" in result.err, result.err
    assert tree(results) == before


def test_a_directory_that_is_not_a_run_dir(gridrun: Gridrun, tmp_path: Path) -> None:
    for args, expected in (
        (["run", str(tmp_path)], "pass a cell directory such as results/<sweep>/cells/<cell_id>"),
        (["show", str(tmp_path)], "pass a cell directory such as results/<sweep>/cells/<cell_id>"),
        (["run", str(tmp_path / "missing")], "plan it with `gridrun plan conf=<sweep>`"),
        # A file is no cell (it was called one that "does not exist").
        (["show", "/etc/passwd"], "/etc/passwd is a file, not a cell directory: pass one such as results/"),
        (["run", "/etc/passwd"], "/etc/passwd is a file, not a cell directory"),
    ):
        result = gridrun(*args)
        assert result.code == 2 and result.err.startswith("gridrun: error: ") and expected in result.err, result.err
    assert list(tmp_path.iterdir()) == []


def test_a_misspelt_axis_in_a_sweep_file_is_named(gridrun: Gridrun, results: Path, tmp_path: Path) -> None:
    # Before: "axes.task is missing", with no word of the `tsak` that was there.
    sweep = tmp_path / "typo.yaml"
    smoke = (Path(__file__).resolve().parents[2] / "gridrun" / "sweeps" / "smoke.yaml").read_text()
    assert "\n  task:" in smoke
    sweep.write_text(smoke.replace("\n  task:", "\n  tsak:", 1))
    result = gridrun("plan", f"conf={sweep}")
    assert result.code == 2 and result.err == f"gridrun: error: {sweep}: unknown axis 'tsak' (did you mean 'task'?)\n"
    assert not results.exists()


@pytest.mark.parametrize(("key", "value", "shape"), [
    ("axes", "[workflow, task]", "'axes' must map axis names to lists of values"),
    ("overrides", "[train.total_steps=2, 3]", "'overrides' must be a list of Hydra overrides"),
    ("overrides", "train.total_steps=2", "'overrides' must be a list of Hydra overrides"),
    ("restrict", "{transfer: [1.7b]}", "'restrict' must map a kind to axes and their values"),
    ("cell_gpu", "{'*': [h100]}", "'cell_gpu' must map a glob on cell ids to a GPU class"),
])
def test_a_sweep_file_key_of_the_wrong_shape_is_one_line(gridrun: Gridrun, results: Path, tmp_path: Path, key: str,
                                                          value: str, shape: str) -> None:
    # The sweep file is read by the run schema's typed loader; its error names the key's shape.
    sweep = tmp_path / "shape.yaml"
    smoke = (Path(__file__).resolve().parents[2] / "gridrun" / "sweeps" / "smoke.yaml").read_text()
    text = "".join(line for line in smoke.splitlines(keepends=True) if not line.startswith(f"{key}:"))
    sweep.write_text(text.replace("axes:", f"{key}: {value}\naxes:", 1) if key != "axes" else f"axes: {value}\n")
    result = gridrun("plan", f"conf={sweep}")
    assert result.code == 2 and result.err.startswith(f"gridrun: error: {sweep}: {shape}"), result.err
    assert result.err.count("\n") == 1
    assert not results.exists()


def test_resubmit_needs_a_selection(gridrun: Gridrun, results: Path) -> None:
    assert gridrun("plan", "conf=smoke").code == 0
    result = gridrun("resubmit", "conf=smoke")
    assert result.code == 2 and "--failed, --preempted and/or --cells" in result.err
    result = gridrun("resubmit", "conf=smoke", "--cells", "voting-ip-toy-arith-s9")
    assert result.code == 2 and "(did you mean 'voting-ip-toy-arith-s0'?)" in result.err


def test_a_reader_that_stops_early_is_not_an_error(results: Path, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = dict(os.environ, GRIDRUN_RESULTS=str(results))
    assert subprocess.run([sys.executable, "-m", "gridrun.cli", "plan", "conf=full_matrix"], env=env,
                          capture_output=True, check=False).returncode in (0, 2)  # planned, or refused unfetched
    subprocess.run([sys.executable, "-m", "gridrun.cli", "plan", "conf=smoke"], env=env, capture_output=True, check=True)
    piped = subprocess.run(f"{sys.executable} -m gridrun.cli status conf=smoke --json | head -c 10", shell=True,
                           env=env, capture_output=True, text=True, check=False)
    assert piped.stderr == "" and len(piped.stdout) == 10


def test_an_unknown_log_level_is_one_note_and_the_command_runs(results: Path) -> None:
    import os
    import subprocess
    import sys

    env = dict(os.environ, GRIDRUN_RESULTS=str(results), GRIDRUN_LOG="verbose")
    done = subprocess.run([sys.executable, "-m", "gridrun.cli", "plan", "conf=smoke", "--dry-run"], env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stderr.count("\n") == 1 and "GRIDRUN_LOG=verbose is not a level" in done.stderr


def test_the_canary_refuses_a_sweep_it_cannot_project_before_it_runs(gridrun: Gridrun, results: Path) -> None:
    result = gridrun("canary", "cluster=local", "conf=nonexistent")
    assert result.code == 2 and "no sweep 'nonexistent'" in result.err and result.err.count("\n") == 1, result.err
    assert not results.exists()


def test_fetch_from_a_pipe_says_what_it_is(gridrun: Gridrun, results: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.chdir(tmp_path)  # no prepared data/math here
    fifo = tmp_path / "math.fifo"
    os.mkfifo(fifo)
    result = gridrun("fetch", "conf=full_matrix", "task=math", "scale=0.6b", "workflow=voting", "policy=shared",
                     "kind=train", "seed=0", f"grid.data_root={tmp_path / 'data'}", f"--data-from=math={fifo}")
    assert result.code == 2 and "neither a file nor a folder" in result.err and result.err.count("\n") == 1, result.err


def test_a_users_option_file_cannot_rename_the_shipped_option_it_replaces(
    gridrun: Gridrun, results: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # conf/policy/shared.yaml saying isolated would file isolated cells under -sp- ids.
    (tmp_path / "conf" / "policy").mkdir(parents=True)
    (tmp_path / "conf" / "policy" / "shared.yaml").write_text("name: isolated\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GRIDRUN_CONFIG_DIR", raising=False)
    result = gridrun("plan", "conf=smoke", "--dry-run")
    assert result.code == 2 and "says name: isolated, but policy=shared is gridrun's 'shared'" in result.err, result.err
    assert result.err.count("\n") == 1
