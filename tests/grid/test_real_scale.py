"""Real scale at plan time (issue 29): every row fits its micro-batch budget or the plan
refuses the cell in one line naming the knob; full_matrix's default puts the cells whose
rows would not fit on the GPU class whose budget holds them; the vLLM engine's memory
share comes from the memory model; `gridrun canary`'s report reads a run dir alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gridrun.grid.canary import adapter_lines, canary_overrides, measured_step_s, rank_lines, report, sample_data
from gridrun.grid.compose import Composer
from gridrun.grid.cost import MeasuredStep, cell_shape
from gridrun.grid.plan import PlannedCell, make_plan
from gridrun.grid.spec import load_spec
from gridrun.memory import ENGINE_SHARE_CAP, GIB, engine_share, longest_row, predict
from gridrun.seam.runconfig import dump_config
from gridrun.seam.rundir import RunDir
from gridrun.tasks.prepared import MATH_SAMPLE
from tests.grid.conftest import Gridrun, tree


def test_a_row_longer_than_its_budget_is_refused_in_one_line(gridrun: Gridrun, results: Path) -> None:
    # Eval-Opt math on 0.6B's L40s budget: 30,720 + 5,120 = 35,840 tokens > 28,672.
    result = gridrun("plan", "conf=full_matrix", "workflow=eval_opt", "task=math", "scale=0.6b", "kind=train", "gpu=l40s")
    assert result.code == 2 and result.err.strip().count("\n") == 0
    assert ("cell eval_opt-ip-0.6b-math-s0: its longest row (30720 + 5120 = 35840 tokens) exceeds "
            "train.micro_token_budget=28672 (0.6b on l40s) and a row is never split: set gpu=h100 (budget 51712) or "
            "train.micro_token_budget>=35840 or lower lengths.max_prompt_tokens or lengths.max_response_tokens") in result.err
    assert tree(results) == []
    # 1.7B on L40s (23,554) and 4B on L40s (10,240) too; 4B has no roomier class than H100's 40,960.
    result = gridrun("plan", "conf=full_matrix", "workflow=voting", "task=math", "scale=4b", "kind=train", "gpu=l40s")
    assert "its longest row (20480 + 5120 = 25600 tokens) exceeds train.micro_token_budget=10240" in result.err
    assert "set gpu=h100 (budget 40960) or" in result.err
    # A cell that does not train has no rows to fit.
    assert gridrun("plan", "conf=full_matrix", "workflow=eval_opt", "task=math", "scale=0.6b", "kind=base",
                   "gpu=l40s").code == 0


def test_full_matrix_puts_only_the_eval_opt_06b_math_cells_on_h100(results: Path) -> None:
    composer = Composer()
    plan = make_plan(load_spec("full_matrix", ["scale=0.6b", "task=math"], composer), composer)
    gpus = {pc.id: pc.resources["gpu_class"] for pc in plan.cells}
    assert {cell for cell, gpu in gpus.items() if gpu == "h100"} == {"eval_opt-ip-0.6b-math-s0", "eval_opt-sp-0.6b-math-s0"}
    assert gpus["voting-ip-0.6b-math-s0"] == gpus["base-eval_opt-0.6b-math"] == "l40s"
    for pc in plan.cells:
        # Every training cell's longest row fits its budget; the budgets are the paper's.
        assert not pc.config.trains or longest_row(pc.config) <= pc.config.train.micro_token_budget
        assert pc.config.train.micro_token_budget == {"h100": 51712, "l40s": 28672}[gpus[pc.id]]
    # A gpu= on the command line is for every cell: then the row check speaks.
    with pytest.raises(Exception, match="exceeds train.micro_token_budget=28672"):
        make_plan(load_spec("full_matrix", ["scale=0.6b", "task=math", "gpu=l40s"], composer), composer)


def test_the_engine_share_is_the_gpu_less_the_trainer() -> None:
    composer = Composer()
    plan = make_plan(load_spec("full_matrix", ["scale=4b", "task=math", "workflow=voting", "kind=train"], composer),
                     composer)
    for pc in plan.cells:
        share = pc.config.engine.gpu_memory_utilization
        usable = pc.resources["gpu_memory_gib"]
        # Frozen into config.yaml: what the engine starts with, on the H100's usable 79.1 GiB.
        assert usable == 79.1 and share == engine_share(pc.config, usable) and 0 < share <= ENGINE_SHARE_CAP
        estimate = predict(pc.config, usable)
        # Beside what the trainer keeps (weights, adapters: IP keeps two, the reserve) and a
        # CUDA context for each of the two processes, the rollout phase fills the card but the
        # share's rounding down to 0.01 (0.8 GiB at most).
        assert (usable - 0.01 * usable) * GIB < estimate.rollout_phase <= usable * GIB
    ip, sp = sorted(plan.cells, key=lambda pc: pc.id)
    assert ip.config.engine.gpu_memory_utilization < sp.config.engine.gpu_memory_utilization  # two adapters' state
    # Small models hit the released code's cap.
    small = make_plan(load_spec("full_matrix", ["scale=1.7b", "task=math", "workflow=voting", "kind=train"], composer),
                      composer)
    assert {pc.config.engine.gpu_memory_utilization for pc in small.cells} == {ENGINE_SHARE_CAP}
    # A share set by hand is kept (and the fit check judges it).
    pinned = make_plan(load_spec("full_matrix", ["scale=1.7b", "task=math", "workflow=voting", "kind=train",
                                                 "engine.gpu_memory_utilization=0.6"], composer), composer)
    assert {pc.config.engine.gpu_memory_utilization for pc in pinned.cells} == {0.6}


# The paper's cells whose update peak and awake engine would not fit one card together.
PAPER_CELLS = {"voting-ip-1.7b-math-s0": ("scale=1.7b", "h100"), "voting-ip-4b-math-s0": ("scale=4b", "h100"),
               "orch_workers-ip-4b-math-s0": ("scale=4b", "h100"), "voting-ip-0.6b-math-s0": ("scale=0.6b", "l40s")}


@pytest.mark.parametrize("cell_id", PAPER_CELLS)
def test_every_phase_of_the_papers_cells_fits_the_cards_usable_memory(cell_id: str) -> None:
    scale, gpu = PAPER_CELLS[cell_id]
    composer = Composer()
    plan = make_plan(load_spec("full_matrix", [scale, "task=math", "kind=train"], composer), composer)
    (pc,) = [pc for pc in plan.cells if pc.id == cell_id]
    usable = pc.resources["gpu_memory_gib"]
    assert (pc.resources["gpu_class"], usable) == (gpu, {"h100": 79.1, "l40s": 44.4}[gpu])
    estimate = predict(pc.config, usable)
    # The update beside the sleeping engine, the rollout (and validation) beside the awake one.
    assert set(estimate.phases) == {"update", "rollout"}
    for phase, total in estimate.phases.items():
        assert total <= usable * GIB, f"{cell_id}: {phase} {total / GIB:.1f} GiB of {usable}"
    assert pc.gpu_mem_gib == pytest.approx(estimate.peak / GIB)
    # Woken beside the update's reserved peak (no empty_cache between them), the engine would
    # not fit: the trainer returns its cache first (tests/test_training.py checks the order).
    assert estimate.unreleased > usable * GIB


# docs/real-scale.md's table of what each phase holds, in its order.
DOC_CELLS = ("voting-ip-1.7b-math-s0", "orch_workers-ip-1.7b-math-s0", "voting-ip-4b-math-s0", "voting-sp-4b-math-s0",
             "orch_workers-ip-4b-math-s0", "voting-ip-0.6b-math-s0")


def test_the_docs_say_what_each_phase_holds() -> None:
    composer = Composer()
    planned = {pc.id: pc for scale in ("0.6b", "1.7b", "4b") for pc in make_plan(
        load_spec("full_matrix", [f"scale={scale}"], composer), composer).cells}

    def row(pc: PlannedCell) -> str:
        usable = pc.resources["gpu_memory_gib"]
        e = predict(pc.config, usable)
        f = [f"{v / GIB:.2f}" for v in (e.trainer_update, e.engine_asleep, e.contexts, e.update_phase, e.trainer_kept,
                                        e.rollout, e.contexts, e.rollout_phase, e.unreleased)]
        return (f"| {pc.id} | {pc.resources['gpu_class']} {usable} | {pc.config.engine.gpu_memory_utilization:.2f} | "
                f"{f[0]} + {f[1]} + {f[2]} = {f[3]} | {f[4]} + {f[5]} + {f[6]} = {f[7]} | {f[8]} |")

    doc = (Path(__file__).parents[2] / "docs" / "real-scale.md").read_text()
    rows = [row(planned[cell_id]) for cell_id in DOC_CELLS]
    assert "\n".join(rows) in doc
    # The shares the full matrix's H100 cells get, as the docs range them.
    shares = {scale: sorted({pc.config.engine.gpu_memory_utilization for pc in planned.values()
                             if pc.resources["gpu_class"] == "h100" and pc.config.engine.name == "vllm"
                             and pc.cell.coords().get("scale") == scale}) for scale in ("0.6b", "1.7b", "4b")}
    assert shares["0.6b"] == shares["1.7b"] == [0.85]
    assert (f"On H100 the full matrix's cells get 0.85 at 0.6B and 1.7B and {shares['4b'][0]:.2f}–{shares['4b'][-1]:.2f} "
            "at 4B") in " ".join(doc.split())


def test_a_share_pinned_above_what_the_trainer_leaves_is_refused_in_one_line(gridrun: Gridrun, results: Path) -> None:
    # Orch-Workers-IP 4B keeps three adapters' state: 0.82 (the two-adapter cells' share) does
    # not fit beside it on an H100's usable 79.1 GiB.
    result = gridrun("plan", "conf=full_matrix", "workflow=orch_workers", "policy=isolated", "scale=4b", "task=math",
                     "kind=train", "engine.gpu_memory_utilization=0.82")
    assert result.code == 2 and result.err.strip().count("\n") == 0
    assert ("cell orch_workers-ip-4b-math-s0 cannot fit on h100: its rollout phase needs 80.0 GiB per GPU of 79.1 "
            "usable (trainer 13.2 (weights 7.5, adapters 4.9), engine 64.9, CUDA contexts 2.0): lower "
            "engine.gpu_memory_utilization (now 0.82; at most 0.80 fits), or pick a larger gpu=") in result.err
    assert tree(results) == []


# --- the canary's report (from files only) -----------------------------------------------------
def _rank(rank: int, visible: str | None, uuid: str | None) -> dict:
    memory = {"free_gpu_gb_awake": 10.0, "free_gpu_gb_asleep": 70.0, "free_gpu_gb_updated": 55.0,
              "trainer_peak_gb": 20.5, "free_gpu_gb_released": 66.0, "trainer_kept_gb": 9.5, "free_gpu_gb_woken": 11.0}
    step = {"step": 3, "stages": [{"requests": 96, "seconds": 2.0, "tokens": 4000}], "rollout_s": 2.5,
            "update_s": 4.0, "update_tokens": 8000, "gather_s": 0.25,
            **{key: value if uuid else None for key, value in memory.items()}}
    return {"rank": rank, "world": 2, "host": "node1", "cuda_visible_devices": visible,
            "device": "cuda:0" if uuid else "cpu", "gpu_uuid": uuid, "gpu_name": "H100" if uuid else None,
            "gpu_total_gb": 79.2 if uuid else None, "engine": "vllm", "steps": [step]}


def _canary_dir(tmp_path: Path, state: str, ranks: list[dict]) -> tuple[RunDir, object]:
    composer = Composer()
    (cell,) = make_plan(load_spec("canary", [], composer), composer).cells
    run_dir = RunDir(tmp_path / cell.id)
    run_dir.root.mkdir()
    run_dir.config_yaml.write_text(dump_config(cell.config))
    run_dir.state_json.write_text(json.dumps({"state": state, "job_id": "7", "error": "boom\nOOM on rank 1"}))
    for record in ranks:
        run_dir.write_rank_record(record["rank"], record)
    rows = [{"step": s, "split": "train", "time/step_s": t} for s, t in ((1, 30.0), (2, 10.0), (3, 12.0))]
    rows[-1].update({"adapter_check/generator/served": -1.25, "adapter_check/generator/zero": -1.5,
                     "adapter_check/generator/trainer": -1.25})
    run_dir.append_metrics(rows)
    return run_dir, cell


def test_the_canary_reports_each_rank_and_says_go(tmp_path: Path) -> None:
    run_dir, cell = _canary_dir(tmp_path, "done", [_rank(0, "0", "GPU-aaa"), _rank(1, "1", "GPU-bbb")])
    rows = run_dir.read_metrics()
    # The step after the warm-up: median of 10 and 12.
    assert measured_step_s(rows) == 11.0
    lines = rank_lines(run_dir.read_rank_records()[1])
    assert lines[0].startswith("rank 1/2 on node1: GPU GPU-bbb (H100, 79 GiB); CUDA_VISIBLE_DEVICES=1")
    # The free memory at each hand-over, and what the trainer reserved and kept.
    assert lines[1] == ("  free GPU memory (GiB, step 3): 10.0 with the engine awake, 70.0 asleep before the update, "
                        "55.0 after it, 66.0 with the trainer's cache returned before the wake, 11.0 after the wake")
    assert lines[2] == "  trainer (GiB): update peak 20.5 reserved, 9.5 kept beside the awake engine"
    assert rank_lines(_rank(0, None, None))[1] == "  GPU memory at the hand-overs: n/a (CPU) (step 3)"
    assert "rollout stage 0: 96 requests, 2.00 s, 4000 tokens (2,000 tok/s)" in lines[3]
    continuous = _rank(1, "1", "GPU-bbb")
    continuous["steps"][0]["stages"][0]["continuous"] = True  # engine=vllm: the rollout has no stages
    assert "rollout (continuous, no stages): 96 requests, 2.00 s" in rank_lines(continuous)[3]
    assert "update: 4.00 s, 8000 tokens (2,000 tok/s); gather across ranks 0.250 s" in lines[4]
    assert adapter_lines(rows, ["aggregator", "generator"], "vllm") == [
        "adapter check aggregator: not run",
        "adapter check generator (step 3): served -1.25, zero adapter -1.5, trainer -1.25",
    ]
    assert adapter_lines(rows, ["aggregator"], "hf") == [
        "adapter check aggregator: not run (engine hf samples from the trainer's own adapters)"]
    # The projection is the dry run's plan with the canary's step in place of the model's for
    # its shape (here both cells are of it): 8 problems in 11 s, per problem, for the cell's own.
    measured = MeasuredStep(cell_shape(cell.config, "h100"), 11.0, 8, "canary: test")
    composer = Composer()
    (taken,) = make_plan(load_spec("canary", [], composer), composer, measured).cells
    assert taken.est_step_s == 11.0 and taken.rate_source == "canary: test"
    verdict = report(run_dir, cell, "full_matrix", [taken, taken], cpu=False)
    # The memory model's numbers for the cell, to read beside each rank's.
    assert ("memory model (GiB per GPU of 79.1 usable): trainer update peak 15.8, kept 5.8; engine 67.2 awake, 0.7 "
            "asleep; phases: update 18.4, rollout 75.0") in verdict.lines
    assert verdict.lines[-2] == (f"measured step 11.00 s (8 problems; {11.0 / cell.est_step_s:.2f}x the cost model's "
                                 f"{cell.est_step_s:.2f} s for this cell)")
    assert verdict.go and verdict.lines[-1] == (
        f"GO: projected {2 * taken.est_hours / 24:,.1f} node-days for full_matrix (2 cells; the dry run's cost model, "
        "this step in place of its prediction for 2 cell(s) of its shape)")


@pytest.mark.parametrize(
    ("state", "ranks", "why"),
    [
        ("failed", [_rank(0, "0", "GPU-a"), _rank(1, "1", "GPU-b")], "the cell ended failed: OOM on rank 1"),
        ("done", [_rank(0, "0", "GPU-a")], "1 of 2 ranks recorded where they ran"),
        ("done", [_rank(0, "0", "GPU-a"), _rank(1, "0", "GPU-a")], "two ranks share a GPU"),
        ("done", [_rank(0, "0,1", None), _rank(1, "0,1", None)], "a rank sees several GPUs"),
    ],
)
def test_the_canary_says_no_go_and_why(tmp_path: Path, state: str, ranks: list[dict], why: str) -> None:
    run_dir, cell = _canary_dir(tmp_path, state, ranks)
    verdict = report(run_dir, cell, "full_matrix", [cell], cpu=False)
    assert not verdict.go and verdict.lines[-1].startswith("NO-GO: ") and why in verdict.lines[-1]


def test_a_cpu_canary_without_prepared_math_trains_on_the_shipped_sample(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    composer = Composer()

    def canary(cpu: bool, *overrides: str) -> object:
        (cell,) = make_plan(load_spec("canary", [*canary_overrides("local", False, cpu), *overrides], composer),
                            composer).cells
        return cell.config

    nothing = tmp_path / "data"
    assert sample_data(canary(True, f"grid.data_root={nothing}"), True, []) == [f"task.data_path={MATH_SAMPLE}"]
    assert capsys.readouterr().out == (
        f"math data at {nothing / 'math'} lacks train.jsonl, val.jsonl, meta.json: this CPU canary trains on the "
        f"38-problem math sample shipped with gridrun ({MATH_SAMPLE}); `gridrun data prepare math` prepares the real set\n")
    # A GPU canary runs on the real data (its preflight names `gridrun data prepare`), and
    # prepared data (the test's GRIDRUN_DATA holds math) is used as it is.
    assert sample_data(canary(False, f"grid.data_root={nothing}"), False, []) == []
    assert sample_data(canary(True), True, []) == [] and capsys.readouterr().out == ""
    # A task.data_path on the command line is the user's word: its preflight says what is missing.
    named = [f"task.data_path={nothing / 'math'}"]
    assert sample_data(canary(True, *named), True, named) == [] and capsys.readouterr().out == ""
    # On this machine the CPU canary is one process planned with gpu=cpu, the documented setting.
    assert canary_overrides("local", False, True)[-1] == "gpu=cpu"


def test_a_cell_gpu_that_is_not_a_mapping_of_classes_is_refused(tmp_path: Path) -> None:
    sweep = tmp_path / "mine.yaml"
    text = (Path(__file__).parents[2] / "gridrun" / "sweeps" / "smoke.yaml").read_text()
    sweep.write_text(text + "cell_gpu: [h100]\n")
    with pytest.raises(Exception, match=r"'cell_gpu' must map a glob on cell ids to a GPU class, e.g. "):
        load_spec(str(sweep), [], Composer())
    # A class that does not exist is named by the composer, for the cells it applies to.
    sweep.write_text(text + "cell_gpu: {'voting-*': a100}\n")
    with pytest.raises(Exception, match=r"a100"):
        make_plan(load_spec(str(sweep), ["workflow=voting", "kind=train", "policy=shared"], Composer()), Composer())
