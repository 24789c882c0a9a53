"""The config search path: a user's own sweeps/<name>.yaml and conf/<group>/<option>.yaml, in
the working directory or --config-dir / $GRIDRUN_CONFIG_DIR, come before gridrun's shipped
ones (which ship inside the package and are found from any working directory); a file of the
same name wins with a one-line notice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gridrun.cli import missing_train_stack
from gridrun.grid import PACKAGE_DIR
from tests.grid.conftest import Gridrun, tree

# A user's sweep: two cells on their own cluster profile.
MY_SWEEP = """\
axes:
  workflow: [voting]
  task: [math]
  scale: [1.7b]
  policy: [isolated, shared]
  seed: [0]
  kind: [train]
overrides: [cluster=mycluster, launcher=slurm]
"""


def my_cluster(root: Path, name: str = "mycluster") -> Path:
    """root/conf/cluster/<name>.yaml: the shipped paper profile with the user's own H100 partition."""
    text = (PACKAGE_DIR / "conf" / "cluster" / "paper.yaml").read_text()
    path = root / "conf" / "cluster" / f"{name}.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(text.replace("name: paper", f"name: {name}").replace("  h100: h100\n", "  h100: gpu-h100\n", 1))
    return path


def my_sweep(root: Path, name: str = "mine", text: str = MY_SWEEP) -> Path:
    path = root / "sweeps" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory outside the repository, with no conf/ or sweeps/ of its own yet."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("GRIDRUN_CONFIG_DIR", raising=False)
    return work


def test_the_shipped_sweeps_and_groups_are_found_from_outside_the_repository(
    gridrun: Gridrun, results: Path, cwd: Path
) -> None:
    result = gridrun("plan", "conf=full_matrix", "--dry-run")
    assert result.code == 0, result.err
    assert "72 cells" in result.out and "note:" not in result.err
    result = gridrun("plan", "conf=smoke", "cluster=testcluster", "--dry-run")
    assert result.code == 0 and "cluster=testcluster" in result.out, result.err


def test_a_users_sweep_and_cluster_profile_in_the_working_directory_are_found(
    gridrun: Gridrun, results: Path, cwd: Path
) -> None:
    my_sweep(cwd)
    my_cluster(cwd)
    result = gridrun("plan", "conf=mine")
    assert result.code == 0, result.err
    sweep = json.loads((results / "mine" / "sweep.json").read_text())
    assert sweep["cluster"]["name"] == "mycluster" and sweep["cluster"]["partitions"]["h100"] == "gpu-h100"
    assert sorted(c["id"] for c in sweep["cells"]) == ["voting-ip-1.7b-math-s0", "voting-sp-1.7b-math-s0"]
    # Nothing of the user's hides a shipped file: no notice.
    assert "note:" not in result.err


def test_a_users_folder_named_by_config_dir_or_the_environment(
    gridrun: Gridrun, results: Path, cwd: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = tmp_path / "mine"
    my_sweep(mine)
    my_cluster(mine)
    assert gridrun("plan", "conf=mine", "--dry-run").code == 2  # not in the working directory
    result = gridrun("plan", "conf=mine", "--dry-run", "--config-dir", str(mine))
    assert result.code == 0 and "cluster=mycluster" in result.out, result.err
    monkeypatch.setenv("GRIDRUN_CONFIG_DIR", str(mine))
    result = gridrun("plan", "conf=mine", "--dry-run")
    assert result.code == 0 and "cluster=mycluster" in result.out, result.err
    result = gridrun("plan", "conf=mine", "--dry-run", "--config-dir", str(tmp_path / "nowhere"))
    assert result.code == 2 and result.err.strip().endswith(
        f"--config-dir {tmp_path / 'nowhere'} is not a folder: name one holding conf/<group>/ or sweeps/"), result.err


def test_a_users_file_of_a_shipped_name_wins_with_a_one_line_notice(
    gridrun: Gridrun, results: Path, cwd: Path
) -> None:
    # The user's smoke sweep has one workflow; their local profile gives cells 3 cores.
    smoke = (PACKAGE_DIR / "sweeps" / "smoke.yaml").read_text()
    my_sweep(cwd, "smoke", smoke.replace("workflow: [eval_opt, voting, orch_workers]", "workflow: [voting]"))
    local = cwd / "conf" / "cluster" / "local.yaml"
    local.parent.mkdir(parents=True)
    local.write_text((PACKAGE_DIR / "conf" / "cluster" / "local.yaml").read_text().replace(
        "cpus_per_cell: 1", "cpus_per_cell: 3"))
    result = gridrun("plan", "conf=smoke")
    assert result.code == 0, result.err
    sweep = json.loads((results / "smoke" / "sweep.json").read_text())
    assert {c["coords"]["workflow"] for c in sweep["cells"] if c["kind"] == "train"} == {"voting"}
    assert sweep["cluster"]["cpus_per_cell"] == 3
    notes = [line for line in result.err.splitlines() if "note:" in line]
    assert notes == [
        "gridrun: note: using your sweeps/smoke.yaml instead of gridrun's shipped sweeps/smoke.yaml",
        "gridrun: note: using your conf/cluster/local.yaml instead of gridrun's shipped conf/cluster/local.yaml",
    ], result.err


def test_an_unknown_name_still_gets_its_did_you_mean(gridrun: Gridrun, results: Path, cwd: Path) -> None:
    my_sweep(cwd)
    my_cluster(cwd)
    # A user's own name is among the candidates, beside the shipped ones.
    result = gridrun("plan", "conf=mien")
    assert result.code == 2 and "no sweep 'mien' in sweeps or " in result.err and "(did you mean 'mine'?)" in result.err
    result = gridrun("plan", "conf=smok")
    assert result.code == 2 and "(did you mean 'smoke'?)" in result.err, result.err
    result = gridrun("plan", "conf=mine", "cluster=myclustre")
    assert result.code == 2 and "unknown cluster 'myclustre' (did you mean 'mycluster'?)" in result.err, result.err
    result = gridrun("plan", "conf=full_matrix", "cluster=papr")
    assert result.code == 2 and "unknown cluster 'papr' (did you mean 'paper'?)" in result.err, result.err
    assert tree(results) == []


def test_a_sweep_file_by_path_still_plans(gridrun: Gridrun, results: Path, cwd: Path, tmp_path: Path) -> None:
    path = my_sweep(tmp_path / "elsewhere", "theirs")
    my_cluster(cwd)
    result = gridrun("plan", f"conf={path}", "--dry-run")
    assert result.code == 0 and "2 cells" in result.out, result.err


def test_a_command_that_needs_the_trainer_names_the_extra() -> None:
    err = ModuleNotFoundError("No module named 'torch'", name="torch")
    assert missing_train_stack(err, "run") == (
        "gridrun run needs the training stack (torch is not installed): in gridrun's checkout, "
        "pip install -e '.[train]' (or make install; make install-cluster on a GPU cluster)")
    assert missing_train_stack(ModuleNotFoundError("x", name="peft.tuners"), "export") is not None
    assert missing_train_stack(ModuleNotFoundError("x", name="nonexistent"), "run") is None


LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(9))


@pytest.mark.parametrize(("where", "text", "expected"), [
    ("conf/policy/laughs.yaml", LAUGHS, "more than 64 aliases"),
    ("conf/policy/deep.yaml", "name: deep\nx: " + "[" * 50_000 + "]" * 50_000 + "\n", "nested more than 64 deep"),
    ("conf/policy/obj.yaml", "name: obj\nx: !!python/object/apply:os.system ['true']\n", "makes an object"),
    ("conf/cluster/local.yaml", "# @package grid.cluster\nname: local\npartitions: {h100: [\n", "is not valid YAML"),
    ("conf/cluster/mine.yaml", "name: mine\npartitions: {}\n", "lacks the line `# @package grid.cluster`"),
    ("sweeps/laughs.yaml", LAUGHS, "more than 64 aliases"),
    ("sweeps/deep.yaml", "axes: " + "[" * 50_000 + "]" * 50_000 + "\n", "nested more than 64 deep"),
    ("sweeps/huge.yaml", "# " + "x" * (1 << 21) + "\n", "more than a config holds"),
])
def test_hostile_yaml_in_the_users_folder_is_one_line_naming_the_file(
    gridrun: Gridrun, results: Path, cwd: Path, where: str, text: str, expected: str
) -> None:
    path = cwd / where
    path.parent.mkdir(parents=True)
    path.write_text(text)
    conf = f"conf={path.stem}" if where.startswith("sweeps/") else "conf=smoke"
    result = gridrun("plan", conf, "--dry-run")
    assert result.code == 2 and result.err.count("\n") == 1, result.err[-2000:]
    assert expected in result.err and path.name in result.err, result.err
    assert not results.exists()


def test_a_sweep_that_is_a_symlink_loop_says_so(gridrun: Gridrun, results: Path, cwd: Path) -> None:
    (cwd / "sweeps").mkdir()
    (cwd / "sweeps" / "loop.yaml").symlink_to("loop.yaml")
    result = gridrun("plan", "conf=loop", "--dry-run")
    assert result.code == 2 and "symlink loop" in result.err and "did you mean" not in result.err, result.err
