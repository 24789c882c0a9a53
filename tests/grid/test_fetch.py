"""`gridrun fetch` and the plan's refusal of what is not fetched (issue 30, item 1).

Jobs never download, so a model or data set missing on the login node used to surface as
every cell failing in `load_base` after its queue wait. Here: the plan refuses in one line
naming the fetch; `gridrun fetch` downloads each scale's model through huggingface_hub from a
local hub mirror (tests/hub_mirror.py: the real download path and cache layout) and prepares
the data, once; a local model folder keeps each cell's identity.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gridrun import modelfiles
from gridrun.grid.compose import Composer
from gridrun.grid.fetch import missing
from gridrun.grid.plan import make_plan
from gridrun.grid.spec import load_spec
from tests.conftest import FIXTURES, QWEN3, hub_cache_of
from tests.grid.conftest import Gridrun, tree
from tests.hub_mirror import serve

WORLD = Path(__file__).parents[2] / "gridrun" / "toy" / "world"
MATH = FIXTURES / "dapo_math_sample.parquet"


@pytest.fixture
def bare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A login node where nothing was fetched: an empty HF_HOME and data root."""
    home, data = tmp_path / "hf", tmp_path / "data"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("GRIDRUN_DATA", str(data))
    return home, data


def sweep_cells(results: Path, sweep: str = "full_matrix") -> dict[str, dict]:
    return {c["id"]: c for c in json.loads((results / sweep / "sweep.json").read_text())["cells"]}


def test_plan_refuses_an_unfetched_sweep_in_one_line_naming_the_fetch(
    gridrun: Gridrun, results: Path, bare: tuple[Path, Path]
) -> None:
    refused = gridrun("plan", "conf=full_matrix", "scale=0.6b", "task=math", "kind=train")
    assert refused.code == 2 and len(refused.err.strip().splitlines()) == 1, refused.err
    assert "model Qwen/Qwen3-0.6B is not in the hub cache" in refused.err
    assert f"math data at {bare[1] / 'math'} lacks train.jsonl, val.jsonl, meta.json" in refused.err
    assert "Run `gridrun fetch conf=full_matrix scale=0.6b task=math kind=train` first" in refused.err
    assert tree(results) == []
    # `sweep` plans first: nothing is queued either.
    assert gridrun("sweep", "conf=full_matrix", "scale=0.6b", "task=math", "kind=train").code == 2
    assert tree(results) == []
    # The dry run still shows the plan, and says what is not fetched.
    dry = gridrun("plan", "conf=full_matrix", "scale=0.6b", "task=math", "kind=train", "--dry-run")
    assert dry.code == 0 and "not fetched yet" in dry.out


def test_the_toy_world_and_random_init_need_nothing(gridrun: Gridrun, results: Path, bare: tuple[Path, Path]) -> None:
    assert gridrun("plan", "conf=smoke").code == 0
    composer = Composer()
    plan = make_plan(load_spec("full_matrix", ["scale=0.6b", "task=math", "kind=train", "model.init=random", "engine=hf", "engine.max_batch_size=4"], composer),
                     composer)
    # A random-init Qwen3 builds the shipped architecture: only its data must be there.
    assert {tuple(missing(pc.config, {})) for pc in plan.cells} == {
        (f"math data at {bare[1] / 'math'} lacks train.jsonl, val.jsonl, meta.json",)}


def test_fetch_downloads_each_scales_model_from_a_hub_mirror_and_prepares_the_data_once(
    gridrun: Gridrun, results: Path, bare: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each scale's hub id serves its own checkpoint (the toy world's files, config.json told apart).
    repos = {}
    for repo_id in QWEN3:
        folder = shutil.copytree(WORLD, tmp_path / "hub" / repo_id)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "gridrun_test_repo": repo_id}))
        (folder / "README.md").write_text("not a file a cell loads\n")
        repos[repo_id] = folder
    args = ("conf=full_matrix", "task=math", "kind=train", "workflow=voting", "policy=isolated")
    with serve(repos) as mirror:
        monkeypatch.setenv("HF_ENDPOINT", mirror.url)
        first = gridrun("fetch", *args, "--data-from", f"math={MATH}")
        assert first.code == 0, first.err
        for repo_id in QWEN3:
            assert f"fetched model {repo_id} -> " in first.out
            snapshot = modelfiles.cached_snapshot(repo_id)
            assert snapshot is not None and snapshot.is_relative_to(bare[0] / "hub")
            assert json.loads((snapshot / "config.json").read_text())["gridrun_test_repo"] == repo_id
            assert not (snapshot / "README.md").exists()
        assert "fetched data math -> " in first.out and (bare[1] / "math" / "meta.json").is_file()
        # 7 checkpoint files per scale, each downloaded once.
        assert mirror.downloads == 7 * len(QWEN3)
        asked = sum(mirror.requests.values())

        second = gridrun("fetch", *args)
        assert second.code == 0, second.err
        assert "nothing to fetch" in second.out and "model Qwen/Qwen3-4B" in second.out
        assert sum(mirror.requests.values()) == asked  # not even a question to the hub
    planned = gridrun("plan", *args)
    assert planned.code == 0, planned.err


def test_fetch_names_what_it_cannot_download(gridrun: Gridrun, results: Path, bare: tuple[Path, Path],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    with serve({}) as mirror:
        monkeypatch.setenv("HF_ENDPOINT", mirror.url)
        result = gridrun("fetch", "conf=full_matrix", "scale=0.6b", "task=math", "--data-from", f"math={MATH}")
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1
    assert "cannot download Qwen/Qwen3-0.6B (RepositoryNotFoundError" in result.err and "model_dirs" in result.err
    bad = gridrun("fetch", "conf=full_matrix", "scale=0.6b", "task=math", "--data-from", f"code={MATH}")
    assert bad.code == 2 and "no cell of the sweep loads code data" in bad.err


def test_data_fetch_cannot_split_names_the_command_that_can(gridrun: Gridrun, results: Path,
                                                              bare: tuple[Path, Path]) -> None:
    # 10 valid code problems and DeepCoder's 1000 held out: fetch splits with the defaults,
    # and its refusal names the data command, which takes the split's size.
    code = bare[1] / "code"
    args = ("conf=full_matrix", "scale=0.6b", "task=code", "model.init=random", "engine=hf", "gpu=cpu")
    refused = gridrun("fetch", *args, "--data-from", f"code={FIXTURES / 'deepcoder_sample.jsonl'}")
    assert refused.code == 2 and len(refused.err.strip().splitlines()) == 1
    assert "holding out 1000 of 10 valid problems leaves nothing to train on" in refused.err
    command = f"gridrun data prepare code --out {code}"
    assert f"`{command}` takes --from PATH, --val-size, --test-size and --seed" in refused.err
    assert gridrun(*command.split()[1:], "--from", str(FIXTURES / "deepcoder_sample.jsonl"), "--val-size", "2").code == 0
    assert "nothing to fetch" in gridrun("fetch", *args).out


def test_a_local_model_folder_keeps_each_cells_fingerprint_architecture_and_scale(
    gridrun: Gridrun, results: Path, bare: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ("conf=full_matrix", "scale=1.7b,4b", "task=math", "kind=train")
    cached = gridrun("plan", *args, "--results-dir", str(tmp_path / "cached"))  # the autouse HF_HOME is gone: refused
    assert cached.code == 2
    # As on a login node where `gridrun fetch` filled the hub cache.
    hub_cache_of(bare[0], dict.fromkeys(QWEN3, WORLD))
    from gridrun.tasks.data import prepare

    prepare("math", MATH, bare[1] / "math")
    assert gridrun("plan", *args, "--results-dir", str(tmp_path / "cached")).code == 0
    by_cache = sweep_cells(tmp_path / "cached")

    # The same cells from local folders, one per scale, and an empty hub cache.
    shutil.rmtree(bare[0])
    dirs = {repo_id: str(shutil.copytree(WORLD, tmp_path / "models" / repo_id.split("/")[1])) for repo_id in QWEN3[1:]}
    setting = "++grid.cluster.model_dirs={" + ",".join(f"{k}:{v}" for k, v in dirs.items()) + "}"
    planned = gridrun("plan", *args, setting)
    assert planned.code == 0, planned.err
    by_folder = sweep_cells(results)
    assert {k: (c["fingerprint"], c["gpu_mem_gib"], c["coords"]) for k, c in by_folder.items()} == {
        k: (c["fingerprint"], c["gpu_mem_gib"], c["coords"]) for k, c in by_cache.items()}
    config = yaml.safe_load((results / "full_matrix" / "cells" / "voting-ip-4b-math-s0" / "config.yaml").read_text())
    assert config["model"]["name_or_path"] == "Qwen/Qwen3-4B"
    assert json.loads((results / "full_matrix" / "sweep.json").read_text())["cluster"]["model_dirs"] == dirs
    # The local launcher hands them to each cell it starts (the SLURM one: test below).
    from gridrun.grid.launchers.local import LocalLauncher, _Pool
    from gridrun.grid.sweepdir import SweepDir

    pool = _Pool(LocalLauncher({"name": "local"}), SweepDir(results, "full_matrix"), [], 1)
    assert modelfiles.model_dirs_from_env(pool.env) == dirs
    # Per scale: a sweep with a scale whose folder is not named is refused for that scale only.
    refused = gridrun("plan", "conf=full_matrix", "scale=0.6b,1.7b", "task=math", "kind=train", setting)
    assert refused.code == 2 and "Qwen/Qwen3-0.6B" in refused.err and "Qwen3-1.7B" not in refused.err.split(".")[0]


def test_a_cell_loads_the_folder_its_launcher_names_for_its_hub_id(tmp_path: Path) -> None:
    """The run side: `gridrun run` resolves the hub id to the folder the launcher handed it
    ($GRIDRUN_MODEL_DIRS) and transformers loads it; without one, the hub id (the cache)."""
    folder = shutil.copytree(WORLD, tmp_path / "Qwen3-1.7B")
    code = (
        "from gridrun.cellrun import model_files\n"
        "from gridrun.seam.runconfig import ModelSpec\n"
        "from gridrun.train.model import load_base\n"
        "spec = ModelSpec(name_or_path='Qwen/Qwen3-1.7B')\n"
        "files = model_files(spec)\n"
        "model, tok = load_base(spec, files)\n"
        "print(files, type(model).__name__, tok.name_or_path)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           **modelfiles.model_dirs_env({"Qwen/Qwen3-1.7B": str(folder)})}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         cwd=Path(__file__).parents[2], check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [str(folder), "Qwen3ForCausalLM", str(folder)]


def test_a_model_that_is_not_there_names_commands_that_work(tmp_path: Path) -> None:
    code = (
        "from gridrun.seam.runconfig import ModelSpec\n"
        "from gridrun.train.model import ModelLoadError, load_base\n"
        "try:\n"
        "    load_base(ModelSpec(name_or_path='Qwen/Qwen3-0.6B'), 'Qwen/Qwen3-0.6B')\n"
        "except ModelLoadError as err:\n"
        "    print(err)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         cwd=Path(__file__).parents[2], check=False)
    message = out.stdout.strip()
    assert len(message.splitlines()) == 1, out.stderr[-2000:]
    assert "run `gridrun fetch conf=<sweep>`" in message and "model_dirs (Qwen/Qwen3-0.6B: DIR" in message
    # The old advice changed the cell's fingerprint and loaded one model for every scale.
    assert "model.name_or_path=DIR" not in message


def test_the_launchers_hand_each_cell_the_profiles_model_folders(tmp_path: Path) -> None:
    from gridrun.grid.launchers.cluster import cluster_spec
    from gridrun.grid.launchers.slurm import setup_lines

    dirs = {"Qwen/Qwen3-4B": "/shared/models/Qwen3-4B"}
    lines = setup_lines(cluster_spec({"name": "mine", "model_dirs": dirs}), {"HF_HOME": "/shared/hf"})
    assert "export HF_HOME=/shared/hf" in lines
    assert f"export GRIDRUN_MODEL_DIRS='{json.dumps(dirs)}'" in lines
    assert modelfiles.model_dirs_from_env(modelfiles.model_dirs_env(dirs)) == dirs
    # Without model_dirs the job script is as before (tests/grid/golden/sbatch_*.sh).
    assert not [line for line in setup_lines(cluster_spec({"name": "mine"}), {}) if "MODEL_DIRS" in line]
