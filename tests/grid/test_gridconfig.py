"""The grid root's schema: a cluster profile, GPU class or launcher file with a misspelled
key or a wrong type fails `gridrun plan` in one line naming the key, its closest valid
spelling and the file; sweep.json records the checked profile with its defaults filled in."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import yaml

import gridrun.grid.compose as compose_module
from gridrun.grid import PACKAGE_DIR
from gridrun.grid.compose import Composer
from gridrun.grid.errors import GridError
from gridrun.grid.launchers.cluster import ClusterSpec, cluster_spec
from gridrun.grid.launchers.local import LocalSettings
from gridrun.grid.launchers.slurm import SlurmSettings
from tests.grid.conftest import Gridrun, tree


@pytest.fixture
def conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of conf/ that `gridrun plan` composes from, for a user's own profile files."""
    copy = tmp_path / "conf"
    shutil.copytree(PACKAGE_DIR / "conf", copy)
    monkeypatch.setattr(compose_module, "CONF_DIR", copy)
    return copy


def profile(conf: Path, name: str, old: str, new: str, group: str = "cluster", source: str = "paper") -> None:
    """conf/<group>/<name>.yaml: the shipped <source> profile with one line edited."""
    text = (conf / group / f"{source}.yaml").read_text()
    assert old in text
    (conf / group / f"{name}.yaml").write_text(text.replace(old, new).replace(f"name: {source}", f"name: {name}"))


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        # The example: the first key a new user writes, misspelled.
        ("partitions:", "partiton:",
         "unknown config key 'grid.cluster.partiton' (did you mean 'grid.cluster.partitions'?): fix conf/cluster/mine.yaml"),
        ("qos: null", "qso: null", "unknown config key 'grid.cluster.qso' (did you mean 'grid.cluster.qos'?)"),
        # A key of a cell_overrides entry, checked as deep as it goes.
        ("cell_overrides: {}", "cell_overrides: {'*-4b-*': {time_limt_h: 72}}",
         ("unknown config key 'grid.cluster.cell_overrides.*-4b-*.time_limt_h' (did you mean "
          "'grid.cluster.cell_overrides.*-4b-*.time_limit_h'?): fix conf/cluster/mine.yaml")),
        # Wrong types: a word for a number, a string for a list.
        ("cpus_per_cell: 16", "cpus_per_cell: many", "grid.cluster.cpus_per_cell: expected an integer, got 'many'"),
        ("sbatch_extra: []", "sbatch_extra: --exclusive", "grid.cluster.sbatch_extra: expected a list, got '--exclusive'"),
    ],
)
def test_a_bad_cluster_profile_fails_plan_in_one_line_naming_the_key(
    gridrun: Gridrun, results: Path, conf: Path, old: str, new: str, message: str
) -> None:
    profile(conf, "mine", old, new)
    result = gridrun("plan", "conf=full_matrix", "cluster=mine", "scale=1.7b")
    assert result.code == 2 and message in result.err, result.err
    assert result.err.strip().count("\n") == 0 and "Traceback" not in result.err
    assert tree(results) == []


def test_a_bad_launcher_or_gpu_file_names_its_own_file(gridrun: Gridrun, results: Path, conf: Path) -> None:
    # The shipped file names the launcher only (its settings' defaults are SlurmSettings'): a
    # user's own adds the one it changes, misspelled.
    profile(conf, "myslurm", "name: slurm", "name: slurm\nsignal_delay: 300", group="launcher", source="slurm")
    result = gridrun("plan", "conf=full_matrix", "cluster=paper", "launcher=myslurm", "scale=1.7b")
    # The settings are the slurm launcher's (name: myslurm is not one): the name is checked first.
    assert result.code == 2 and "no launcher 'myslurm'" in result.err, result.err
    (conf / "launcher" / "myslurm.yaml").write_text((conf / "launcher" / "myslurm.yaml").read_text().replace(
        "name: myslurm", "name: slurm"))
    result = gridrun("plan", "conf=full_matrix", "cluster=paper", "launcher=myslurm", "scale=1.7b")
    assert result.code == 2 and result.err.strip().endswith(
        "unknown config key 'grid.launcher.signal_delay' (did you mean 'grid.launcher.signal_delay_s'?): "
        "fix conf/launcher/myslurm.yaml"), result.err
    (conf / "gpu" / "h100.yaml").write_text((conf / "gpu" / "h100.yaml").read_text().replace("memory_gib:", "memory:"))
    result = gridrun("plan", "conf=full_matrix", "scale=1.7b")
    assert result.code == 2 and "unknown config key 'grid.gpu.memory' (did you mean 'grid.gpu.memory_gib'?): " \
        "fix conf/gpu/h100.yaml" in result.err, result.err


def test_sweep_json_records_the_checked_profile_with_its_defaults(gridrun: Gridrun, results: Path) -> None:
    # conf/cluster/local.yaml writes five keys; sweep.json holds all of ClusterSpec's, so the
    # launchers read every one without a default of their own.
    assert gridrun("plan", "conf=smoke").code == 0
    recorded = json.loads((results / "smoke" / "sweep.json").read_text())
    assert recorded["cluster"] == {
        "name": "local", "partitions": {}, "gpu_types": {}, "constraints": {}, "account": None, "qos": None,
        "cpus_per_cell": 1, "mem_gb_per_cell": 4, "time_limit_h": 24, "tasks_per_cell": None, "sbatch_extra": [],
        "setup": [], "cell_overrides": {}, "model_dirs": {}, "check_shared_paths": True,
    }
    assert recorded["launcher"] == {"name": "local", "max_parallel": None, "poll_s": 0.5, "term_timeout_s": 30}
    assert cluster_spec(recorded["cluster"]) == ClusterSpec(name="local", cpus_per_cell=1, mem_gb_per_cell=4)


def test_a_copied_profile_that_kept_its_name_is_named_by_its_file(gridrun: Gridrun, results: Path, conf: Path) -> None:
    # paper.yaml copied to mine.yaml, `name: paper` left as it was: the error names mine.yaml.
    (conf / "cluster" / "mine.yaml").write_text((conf / "cluster" / "paper.yaml").read_text().replace("qos:", "qso:"))
    result = gridrun("plan", "conf=full_matrix", "cluster=mine", "scale=1.7b")
    assert result.code == 2 and result.err.strip().endswith("(did you mean 'grid.cluster.qos'?): fix conf/cluster/mine.yaml")


def test_a_hand_edited_sweep_json_is_read_back_through_the_schema() -> None:
    # No composition at hand: the profile is named by its `name:`.
    with pytest.raises(GridError, match=r"grid.cluster.gpu_type' \(did you mean 'grid.cluster.gpu_types'\?\): "
                       r"fix the conf/cluster/ file of cluster 'paper'$"):
        cluster_spec({"name": "paper", "gpu_type": {}})


def test_launcher_defaults_live_in_their_settings_dataclass(gridrun: Gridrun, results: Path, conf: Path) -> None:
    # The shipped launcher files name their launcher and nothing else: each default is written
    # once, in the settings dataclass beside its launcher, which Hydra composes under the file.
    for name, settings in (("local", LocalSettings), ("slurm", SlurmSettings)):
        assert yaml.safe_load((conf / "launcher" / f"{name}.yaml").read_text()) == {
            "defaults": [f"/schema/launcher/{name}@_here_", "_self_"], "name": name}
        node = Composer(conf).compose(["cell.id=x", f"launcher={name}"])["grid"]["launcher"]
        assert node == dataclasses.asdict(settings())
    # A copy of the shipped file under another name keeps them: a setting it changes wins, one
    # it leaves is overridden as before (no `+`).
    profile(conf, "myslurm", "name: slurm", "name: slurm\nmax_attempts: 2", group="launcher", source="slurm")
    (conf / "launcher" / "myslurm.yaml").write_text((conf / "launcher" / "myslurm.yaml").read_text().replace(
        "name: myslurm", "name: slurm"))
    assert gridrun("plan", "conf=smoke", "cluster=testcluster", "launcher=myslurm", "grid.launcher.max_parallel=8").code == 0
    recorded = json.loads((results / "smoke" / "sweep.json").read_text())["launcher"]
    assert recorded == {**dataclasses.asdict(SlurmSettings()), "max_attempts": 2, "max_parallel": 8}
