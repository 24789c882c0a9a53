"""The dry run's cost model (gridrun/grid/cost.py) and disk model (gridrun/grid/disk.py): one cell worked
out by hand, the measured rates read from the GPU check's rows, and the canary's step
replacing the model's for its shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gridrun.grid import cost
from gridrun.grid.compose import Composer
from gridrun.grid.cost import (
    MeasuredStep,
    Rate,
    gpu_check_rates,
    measured_update_rates,
    read_measured_step,
    shape,
    step_cost,
)
from gridrun.grid.disk import cell_disk
from gridrun.grid.plan import make_plan
from gridrun.grid.spec import load_spec
from gridrun.memory import GIB
from gridrun.seam.runconfig import config_from_dict

N_1_7B = 1_720_574_976  # Qwen3-1.7B's parameters (tests/test_memory.py works them out)
LORA_1_7B = 69_730_304  # one rank-64 all-linear adapter of it


def voting(**train: object) -> object:
    return config_from_dict({
        "cell": {"id": "x", "kind": "train"}, "model": {"name_or_path": "Qwen/Qwen3-1.7B", "dtype": "bfloat16"},
        "workflow": {"name": "voting"}, "task": {"name": "math", "data_path": "data/math"}, "policy": {"name": "isolated"},
        "engine": {"name": "vllm", "gpu_memory_utilization": 0.8},
        "lengths": {"max_prompt_tokens": 20480, "max_response_tokens": 5120}, "train": train})


def test_a_voting_step_worked_by_hand() -> None:
    config = voting()
    # 3 voters (200-token problem, 2,560-token mean response: half the limit), then the
    # aggregator reading all three (200 + 3 x 2,560 tokens), answering 4% of the limit.
    assert shape(config) == [cost.Call("generator", 3, 200, 2560), cost.Call("aggregator", 1, 7880, 204.8)]
    rate = 1e14  # FLOP/s per GPU, as if measured
    got = step_cost(config, "h100", 2, 80, measured={("h100", "qwen3-1.7b"): Rate(rate, "measured: test")})
    assert got is not None and got.sources[0] == "measured: test"
    # 64 problems x 8 episodes over 2 GPUs: 256 episodes a rank.
    tokens = 256 * (3 * (200 + 2560) + (7880 + 204.8))
    assert tokens == pytest.approx(4_189_388.8)
    assert got.update_s == pytest.approx(6 * N_1_7B * tokens / rate)  # 432.5 s
    # Rollout: weights 2 N bytes, KV 28 layers x (K, V) x 8 heads x 128 x 2 bytes per token;
    # the engine's 0.8 of 80 GiB less the weights holds the running sequences' KV.
    weights, kv = 2 * N_1_7B, 28 * 2 * 8 * 128 * 2
    room = 0.8 * 80 * GIB - weights
    bandwidth, prefill_flops = 3.35e12 * 0.6, 989.4e12 * 0.4
    # Voters: 768 requests of mean context 200 + 1,280; 384.6 fit at once, every iteration
    # reads the engine's whole share (weights + a full KV): 34.2 ms a token, and the
    # sampler draws for each seeded request (temperature 0.7): 2.1 ms more.
    running = room / (kv * 1480)
    assert running == pytest.approx(384.58, abs=0.01)
    iteration = (weights + running * 1480 * kv) / bandwidth
    assert iteration == pytest.approx(0.8 * 80 * GIB / bandwidth)
    iteration += running * 5.4e-6
    voters = 768 * 200 * 2 * N_1_7B / prefill_flops + max(768 * 2560 / running * iteration, 5120 * iteration)
    # The aggregator: 256 requests of 7,880-token prompts; its longest answer sets its end.
    running = min(256, room / (kv * (7880 + 102.4)))
    iteration = (weights + running * (7880 + 102.4) * kv) / bandwidth + running * 5.4e-6
    aggregator = 256 * 7880 * 2 * N_1_7B / prefill_flops + max(256 * 204.8 / running * iteration, 5120 * iteration)
    assert got.rollout_s == pytest.approx(voters + aggregator)
    assert 375 < got.rollout_s < 390 and got.step_s == pytest.approx(got.rollout_s + got.update_s)
    # Validation: 1,412 problems, one episode each, 706 a rank.
    assert got.val_s > got.rollout_s
    # 500 steps and 51 validations (step 0, every 10th).
    assert config.planned_validations == 51
    # and one test evaluation of the peak, on a test split of validation's size.
    assert cost.cell_hours(config, got) == pytest.approx((500 * got.step_s + 52 * got.val_s) / 3600)
    assert cost.test_hours(got) == pytest.approx(got.val_s / 3600)


def test_eval_opt_rounds_go_on_for_a_share_of_the_episodes() -> None:
    config = config_from_dict({
        "cell": {"id": "x", "kind": "train"}, "model": {"name_or_path": "Qwen/Qwen3-1.7B", "dtype": "bfloat16"},
        "workflow": {"name": "eval_opt", "rounds": 3}, "task": {"name": "math", "data_path": "data/math"},
        "lengths": {"max_prompt_tokens": 30720, "max_response_tokens": 5120}})
    stages = shape(config)
    assert [(s.role, s.calls) for s in stages] == [("generator", 1), ("evaluator", 1), ("generator", 0.5),
                                                   ("evaluator", 0.5), ("generator", 0.25), ("evaluator", 0.25)]
    # Each turn reads every earlier one: the evaluator's mean is a quarter of the limit.
    assert [s.prompt for s in stages] == [200, 2760, 4040, 6600, 7880, 10440]


def test_rates_come_from_the_gpu_checks_rows(tmp_path: Path) -> None:
    rows = [{"scale": "1.7b", "device": "cuda", "gpu_class": "h100", "seqs": 4, "response_tokens": 5120,
             "update_s": 2.0},
            {"scale": "1.7b", "device": "cuda", "gpu_class": "h100", "seqs": 8, "update_tokens": 40000, "update_s": 3.0,
             "response_tokens": 5120},
            {"scale": "4b", "device": "cpu", "gpu_class": "h100", "seqs": 1, "response_tokens": 16, "update_s": 9.0}]
    (tmp_path / "gpu-h100-2030-01-01.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rates = gpu_check_rates(tmp_path)
    # Rows without their update's tokens count the math prompt beside each response; CPU rows none.
    tokens = 4 * (5120 + cost.CHECK_PROMPT_TOKENS) + 40000
    assert set(rates) == {("h100", "qwen3-1.7b")}
    assert rates["h100", "qwen3-1.7b"].value == pytest.approx(6 * N_1_7B * tokens / 5.0)
    assert rates["h100", "qwen3-1.7b"].source == "measured: bench/measured/gpu-h100-2030-01-01.jsonl"
    # Another scale takes the nearest measured one's rate; another class scales it by bf16 peaks.
    assert cost.update_rate("h100", "qwen3-4b", rates).value == rates["h100", "qwen3-1.7b"].value
    l40s = cost.update_rate("l40s", "qwen3-1.7b", rates)
    assert not l40s.measured and l40s.value == pytest.approx(rates["h100", "qwen3-1.7b"].value * 362.1 / 989.4)
    assert cost.update_rate("l40s", "qwen3-1.7b", {}) is None


def test_the_shipped_rates_are_the_gpu_checks_in_bench_measured(tmp_path: Path) -> None:
    # What every plan reads (package data, so a wheel projects what the checkout does) is what
    # bench/measured/ holds; after adding a GPU check's rows: scripts/ship_rates.py.
    measured = gpu_check_rates(Path(__file__).parents[1] / "bench" / "measured")
    assert measured_update_rates() == measured, "gridrun/grid/update_rates.json is stale: run scripts/ship_rates.py"
    assert ("h100", "qwen3-1.7b") in measured and ("h100", "qwen3-4b") in measured
    # The shipped form holds each rate exactly.
    (tmp_path / "rates.json").write_text(cost.rates_json(measured))
    assert measured_update_rates.__wrapped__(tmp_path / "rates.json") == measured


@pytest.fixture(scope="module")
def full_matrix() -> dict:
    composer = Composer()
    return {pc.id: pc for pc in make_plan(load_spec("full_matrix", [], composer), composer).cells}


def test_the_canary_step_replaces_the_model_for_its_shape(tmp_path: Path, full_matrix: dict) -> None:
    composer = Composer()
    spec = load_spec("full_matrix", [], composer)
    modelled = full_matrix
    (canary,) = make_plan(load_spec("canary", [], composer), composer).cells
    path = tmp_path / "measured-step.json"
    cost.write_measured_step(path, canary.config, canary.resources["gpu_class"], 120.0, canary.id)
    measured = read_measured_step(path)
    assert measured == MeasuredStep(cost.cell_shape(canary.config, "h100"), 120.0, 8,
                                    f"canary: {path} ({canary.id})")
    planned = {pc.id: pc for pc in make_plan(spec, composer, measured).cells}
    # The canary's shape (Voting-IP, 1.7B, math, H100, vLLM): its 8 problems' step, per problem,
    # for 64; every other cell keeps the model's.
    assert planned["voting-ip-1.7b-math-s0"].est_step_s == 120.0 * 64 / 8
    assert planned["voting-ip-1.7b-math-s0"].rate_source.startswith("canary: ")
    changed = [cid for cid in planned if planned[cid].est_hours != modelled[cid].est_hours]
    assert changed == ["voting-ip-1.7b-math-s0"]
    # A damaged file is no measurement: the model stands.
    path.write_text("{")
    assert read_measured_step(path) is None


def test_disk_of_the_largest_cell(full_matrix: dict) -> None:
    cells = full_matrix
    disk = cells["orch_workers-ip-4b-math-s0"].disk
    assert disk is not None
    # Qwen3-4B's rank-64 adapter: 36 layers x 3,670,016 parameters; three adapters (orchestrator,
    # worker, synthesizer), 12 bytes each (float32 weights and two AdamW moments); 2 kept + the
    # peak's + a save's temporary copy.
    lora = 36 * 3_670_016
    assert disk.checkpoint == 3 * lora * 12 and disk.checkpoints_at_once == 4
    assert disk.results == pytest.approx(19.0e9, rel=0.01)
    # vLLM on each of the node's 2 ranks: 3 versions of 3 adapters and the zero adapter, float32.
    assert disk.tmp == 2 * (3 * 3 + 1) * lora * 4
    # A base cell saves nothing; the toy world's cells are counted from its own config.
    assert cells["base-voting-4b-math"].disk.results == 0
    config = voting(keep_checkpoints=1)
    assert cell_disk(config).checkpoint == 2 * LORA_1_7B * 12 and cell_disk(config).checkpoints_at_once == 3
