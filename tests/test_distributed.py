"""Data parallelism (gridrun/train/distributed.py): two gloo ranks on this machine take the
same update as one process, and SIGUSR2 stops a run after a step with a checkpoint."""

from __future__ import annotations

import math
import os
import pickle
import random
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from gridrun.cellrun import model_files, run_cell
from gridrun.seam.runconfig import load_config
from gridrun.seam.rundir import RunDir
from gridrun.train.distributed import Dist, free_local_port
from gridrun.train.policy import adapter_parameters
from gridrun.train.trainer import Trainer
from gridrun.train.update import TrainSeq, UpdateSettings, update
from tests.conftest import make_cell, metric_rows, start_run, twin_cell

LR = 1e-3


def test_shard_gives_contiguous_blocks_that_cover_everything_once() -> None:
    # 10 problems over 4 ranks: 3, 3, 2, 2 (the first 10 % 4 = 2 ranks take one more).
    blocks = [Dist(rank=r, world=4).shard(list(range(10))) for r in range(4)]
    assert blocks == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert Dist().shard([1, 2, 3]) == [1, 2, 3]


def test_stride_splits_a_mini_batch_and_one_rank_is_the_identity() -> None:
    assert [Dist(rank=r, world=2).stride("abcde") for r in range(2)] == [list("ace"), list("bd")]
    one = Dist()
    grads = [torch.ones(2)]
    assert one.gather([1, 2]) == ([1, 2], slice(0, 2))
    assert one.all_reduce_tensors(grads) is grads
    assert one.all_reduce_sum([1.0]) == [1.0] and not one.should_stop()


def test_beside_an_nccl_world_objects_are_gathered_over_a_cpu_group(monkeypatch: pytest.MonkeyPatch) -> None:
    # all_gather_object over nccl pickles into tensors on the GPU, beside the awake rollout
    # engine (validation's episodes): the world makes a gloo group for objects, and gather uses it.
    made: list[dict[str, Any]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda backend, **kwargs: made.append({"world": backend}))
    monkeypatch.setattr(torch.distributed, "new_group", lambda **kwargs: made.append(kwargs) or "the gloo group")
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    dist = Dist.from_env(env)
    assert made == [{"world": "nccl"}, {"backend": "gloo"}] and dist.object_group == "the gloo group"
    used: list[Any] = []

    def all_gather_object(parts: list[Any], items: Any, group: Any = None) -> None:
        used.append(group)
        parts[:] = [["a"], items]

    monkeypatch.setattr(torch.distributed, "all_gather_object", all_gather_object)
    assert dist.gather(["b", "c"]) == (["a", "b", "c"], slice(1, 3)) and used == ["the gloo group"]
    # A gloo world gathers over itself.
    made.clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert Dist.from_env(env).object_group is None and made == [{"world": "gloo"}]


def test_the_cached_memory_goes_back_to_the_driver_on_a_gpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    from gridrun.train.distributed import return_cached_memory

    calls: list[str] = []
    monkeypatch.setattr(gc, "collect", lambda: calls.append("gc.collect") or 0)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("torch.cuda.empty_cache"))
    return_cached_memory(torch.device("cpu"))
    assert calls == []
    return_cached_memory(torch.device("cuda", 0))
    assert calls == ["gc.collect", "torch.cuda.empty_cache"]


# ---------------------------------------------------------------- two ranks vs one process
def _trainer(cell: Path) -> Trainer:
    config = load_config(cell / "config.yaml")
    return Trainer(config, RunDir(cell), model_files(config.model))


def _update(trainer: Trainer, seqs: list[TrainSeq], dist: Dist | None = None) -> dict[str, float]:
    return update(trainer.model, trainer.routing, trainer.optimizers, seqs, UpdateSettings.of(trainer.config, trainer.pad_id),
                  {name: LR for name in trainer.routing.trainable}, random.Random(0), dist)


def _adapters(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {
        f"{name}/{key}": value.detach().clone()
        for name in trainer.routing.trainable
        for key, value in adapter_parameters(trainer.model, name).items()
    }


def _rank_main(rank: int, cell: str, port: int, shards: list[list[TrainSeq]], out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist = Dist.from_env()
    config = load_config(Path(cell) / "config.yaml")
    trainer = Trainer(config, RunDir(cell), model_files(config.model), dist)
    metrics = _update(trainer, shards[rank], dist)
    with open(f"{out}.{rank}", "wb") as handle:
        pickle.dump({"adapters": _adapters(trainer), "metrics": metrics}, handle)
    dist.close()


def two_shards(trainer: Trainer) -> list[list[TrainSeq]]:
    """2 problems x n=2 episodes rolled out (one adapter, "shared"), problem 0's sequences
    for rank 0 and problem 1's for rank 1; advantages -1 and +1 within each problem."""
    episodes = trainer.rollout(trainer.task.train_problems()[:2], 2, 0.7)
    shards: list[list[TrainSeq]] = [[], []]
    for i, episode in enumerate(episodes):
        for turn in episode.turns:
            shards[i // 2].append(TrainSeq(turn.role, "shared", turn.prompt_ids, turn.completion_ids,
                                           turn.logprobs, 1.0 if i % 2 else -1.0, False))
    return shards


@pytest.mark.usefixtures("toy_world")
def test_two_gloo_ranks_take_the_same_update_as_one_process(tmp_path: Path) -> None:
    # Orch-Workers under SP: three roles feed one adapter, 2 problems x n=2 episodes. Rank 0
    # holds problem 0's episodes, rank 1 problem 1's (a group never spans ranks). With a
    # mini-batch of 1 problem x n=2 = 2 sequences there are several optimizer steps, each
    # cut from the gathered, shuffled list exactly as one process cuts it. (The released
    # preset's length-balanced order depends on the rank count, as verl's does: shuffled here.)
    cell = make_cell(tmp_path, workflow={"name": "orch_workers"}, policy={"name": "shared"},
                     train={"ppo_mini_batch": 1}, grpo={"minibatch_order": "shuffled"})
    trainer = _trainer(cell)
    shards = two_shards(trainer)
    before = _adapters(trainer)
    single = _update(trainer, [s for shard in shards for s in shard])
    expected = _adapters(trainer)

    out = str(tmp_path / "rank")
    mp.start_processes(_rank_main, args=(str(cell), free_local_port(), shards, out), nprocs=2, start_method="spawn")
    ranks = [pickle.loads(Path(f"{out}.{r}").read_bytes()) for r in range(2)]

    assert_ranks_took_the_update(before, expected, single, ranks)


def assert_ranks_took_the_update(before: dict[str, torch.Tensor], expected: dict[str, torch.Tensor],
                                 single: dict[str, float], ranks: list[dict[str, Any]]) -> None:
    """Both ranks' adapters and update metrics are one process's (`expected`, `single`)."""
    # Summation order differs (two ranks' partial gradients), so equal up to float noise; Adam
    # normalises each entry, so compare at 1% of one step (lr 1e-3): a wrong shard or loss
    # weight moves entries by a whole step.
    for key, value in expected.items():
        for r in range(2):
            torch.testing.assert_close(ranks[r]["adapters"][key], value, rtol=1e-4, atol=LR / 100)
    # Both ranks hold identical weights after the step, and the update moved them.
    assert all(torch.equal(ranks[0]["adapters"][k], ranks[1]["adapters"][k]) for k in expected)
    assert any(not torch.equal(expected[k], before[k]) for k in expected)
    # Metrics are global on every rank: sequence and token counts add up across the shards,
    # and the per-role gradient norms are those of the summed gradient. chi2, chi2_centered
    # and ppl are means over micro-batches (grpo.chi2_reduction=micro_batch, verl's), and each
    # rank cuts micro-batches from its own stride, so they depend on the rank count as verl's
    # do: both ranks report the same values, from every rank's micro-batches.
    assert single["adapter/shared/opt_steps"] == ranks[0]["metrics"]["adapter/shared/opt_steps"] > 1
    per_micro_batch = ("/chi2", "/chi2_centered", "/ppl")
    for key, value in single.items():
        if key.endswith(per_micro_batch):
            assert ranks[0]["metrics"][key] == ranks[1]["metrics"][key] and math.isfinite(value), key
            continue
        for r in range(2):
            assert ranks[r]["metrics"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


# ---------------------------------------------------------------- SIGUSR2: stop with a checkpoint
@pytest.mark.usefixtures("toy_world")
def test_sigusr2_stops_after_the_step_with_a_checkpoint_and_resume_finishes(tmp_path: Path) -> None:
    # save_every 10 > total_steps: the only checkpoint before the end is the one the stop
    # request writes. The resumed run ends where an uninterrupted one does.
    overrides: dict[str, Any] = {"train": {"total_steps": 4, "val_every": 4, "save_every": 10}}
    straight = make_cell(tmp_path, "straight", **overrides)
    assert run_cell(straight) == 0
    stopped = twin_cell(tmp_path, "stopped", of="straight", **overrides)
    proc = start_run(stopped, until_step=1, stderr=subprocess.PIPE)
    proc.send_signal(signal.SIGUSR2)
    assert proc.wait(120) == 75, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
    state = RunDir(stopped).read_state().to_json()
    assert state["state"] == "preempted" and "SIGUSR2" in state["error"]
    step, _ = RunDir(stopped).latest_checkpoint() or (None, None)
    assert step == state["step"] and 1 <= step < 4
    assert run_cell(stopped) == 0
    a = torch.load(RunDir(straight).checkpoint(4) / "trainer.pt", weights_only=False)
    b = torch.load(RunDir(stopped).checkpoint(4) / "trainer.pt", weights_only=False)
    assert a["sampler"] == b["sampler"]
    assert metric_rows(straight) == metric_rows(stopped)
