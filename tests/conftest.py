"""Shared fixtures: cell directories on the toy world."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

# A small, fast toy cell: every test starts from it and overrides what it checks.
TOY_CELL: dict[str, Any] = {
    "cell": {"id": "test-cell", "kind": "train", "seed": 0},
    "model": {"name_or_path": "toy", "toy": {}},
    "workflow": {"name": "single"},
    # The split every toy test was written against (the params default is now the sweeps' 200).
    "task": {"name": "arith", "n_val": 400},
    "lengths": {"max_prompt_tokens": 256, "max_response_tokens": 48},
    "policy": {"name": "shared"},
    "lora": {"rank": 8, "alpha": 16},
    "engine": {"name": "hf"},
    "sampling": {"temperature": 0.7},
    "grpo": {"n": 2},
    "optim": {"lr": 5.0e-4, "warmup_steps": 0},
    "train": {"total_steps": 2, "batch_problems": 4, "ppo_mini_batch": 4, "val_every": 2, "save_every": 1, "val_problems": 16,
              "gradient_checkpointing": False},
    "logging": {"wandb_mode": "disabled"},
}


FIXTURES = Path(__file__).parent / "fixtures"
# The paper's models, by hub id: every sweep beyond the toy world loads one of them.
QWEN3 = ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B")


def hub_cache_of(home: Path, repos: dict[str, Path]) -> Path:
    """An HF_HOME whose hub cache holds each repo id's `main` snapshot, in huggingface_hub's
    layout (refs/main -> snapshots/<commit>/), the files linked from the folder given."""
    for repo_id, folder in repos.items():
        repo = home / "hub" / f"models--{repo_id.replace('/', '--')}"
        commit = "0" * 40
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True, exist_ok=True)
        for file in folder.iterdir():
            (snapshot / file.name).symlink_to(file)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(commit)
    return home


@pytest.fixture(scope="session")
def fetched_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(HF_HOME, data root) as `gridrun fetch` leaves them for the shipped sweeps: the three
    Qwen3 ids in the hub cache (the toy world's checkpoint files stand in for their weights)
    and math and code prepared, by `gridrun data prepare`'s code, from the fixtures."""
    from gridrun.tasks.data import prepare

    root = tmp_path_factory.mktemp("fetched")
    world = Path(__file__).parents[1] / "gridrun" / "toy" / "world"
    home = hub_cache_of(root / "hf", dict.fromkeys(QWEN3, world))
    prepare("math", FIXTURES / "dapo_math_sample.parquet", root / "data" / "math", val_size=2)
    prepare("code", FIXTURES / "deepcoder_sample.jsonl", root / "data" / "code", val_size=2)
    return home, root / "data"


@pytest.fixture(autouse=True)
def _fetched(fetched_files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test plans as on a login node where `gridrun fetch` has run (plan refuses cells
    whose model or data is absent; tests/grid/test_fetch.py checks that refusal and the fetch)."""
    home, data = fetched_files
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("GRIDRUN_DATA", str(data))


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`base` with `overrides` merged in, node by node; a node naming another option (task
    code over TOY_CELL's arith) replaces the base's, whose keys the other option lacks."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        other_option = isinstance(value, dict) and value.get("name", out.get(key, {}).get("name")) != out.get(key, {}).get("name")
        if isinstance(value, dict) and isinstance(out.get(key), dict) and not other_option:
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def make_cell(root: Path, name: str = "cell", **overrides: Any) -> Path:
    """A planned run dir holding TOY_CELL with `overrides` merged in (group -> dict)."""
    cell = root / name
    cell.mkdir(parents=True)
    config = merge(TOY_CELL, overrides)
    config["cell"]["id"] = name
    if config["workflow"]["name"] == "single" and config["cell"]["kind"] == "train":
        config["cell"]["kind"] = "sa_rl"
    (cell / "config.yaml").write_text(yaml.safe_dump(config))
    return cell


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `sandbox` skip, saying why, on a machine where bubblewrap cannot isolate."""
    marked = [item for item in items if item.get_closest_marker("sandbox")]
    if not marked:
        return
    from gridrun.tasks.sandbox import isolation_status

    ok, reason = isolation_status()
    if not ok:
        skip = pytest.mark.skip(reason=f"no working sandbox here: {reason}")
        for item in marked:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def toy_world() -> Path:
    """The default toy world (built once per machine, then cached)."""
    from gridrun.seam.runconfig import ToySpec
    from gridrun.toy.build import ensure_toy_world

    return ensure_toy_world(ToySpec())


@pytest.fixture(scope="session")
def math_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root holding the math task prepared from the DAPO fixture (3 validation
    problems): what `gridrun data prepare math` writes, without the download."""
    from gridrun.tasks.data import prepare

    root = tmp_path_factory.mktemp("data")
    prepare("math", Path(__file__).parent / "fixtures" / "dapo_math_sample.parquet", root / "math", val_size=3)
    return root


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> None:
    """As `gridrun run` does: tiny CPU models lose badly to thread oversubscription."""
    import torch

    torch.set_num_threads(1)


def twin_cell(root: Path, name: str, of: str, **overrides: Any) -> Path:
    """A cell with `overrides` whose cell id is `of`'s: same seeds, so runs must match it."""
    cell = make_cell(root, name, **overrides)
    (cell / "config.yaml").write_text((cell / "config.yaml").read_text().replace(f"id: {name}", f"id: {of}"))
    return cell


def start_run(cell: Path, until_step: int, stderr: Any = None) -> subprocess.Popen:
    """`gridrun run cell` in a subprocess, returned once its state reaches `until_step`."""
    from gridrun.seam.rundir import RunDir

    env = {**os.environ, "GRIDRUN_LOG": "WARNING"}
    proc = subprocess.Popen([sys.executable, "-m", "gridrun.cli", "run", str(cell)], env=env,
                            stdout=subprocess.DEVNULL, stderr=stderr or subprocess.DEVNULL)
    deadline = time.time() + 120
    while RunDir(cell).read_state().to_json().get("step", 0) < until_step and time.time() < deadline:
        time.sleep(0.05)
    return proc


def wait_until(predicate: Callable[[], Any], what: str, timeout: float, poll: float = 0.5) -> Any:
    """Poll `predicate` until it returns something truthy (returned); fail naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(poll)


def metric_rows(cell: Path) -> list[dict[str, Any]]:
    """metrics.jsonl without wall-clock keys: what must be equal between equivalent runs."""
    from gridrun.seam.rundir import RunDir

    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in RunDir(cell).read_metrics()]


@pytest.fixture(scope="module")
def toy_model(toy_world: Path):
    """(the toy base model, its tokenizer), frozen, on the CPU."""
    from gridrun.seam.runconfig import ModelSpec, ToySpec
    from gridrun.train.model import load_base

    return load_base(ModelSpec(name_or_path="toy", toy=ToySpec()), str(toy_world))
