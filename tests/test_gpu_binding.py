"""One GPU per rank on the training side (issue 29): a rank of several that sees other
than exactly one GPU is refused before its process group or engine starts, and its device
is that one GPU whatever its local rank (the SLURM job bound it: gridrun/grid/launchers/
process.py bind_gpu, tested in tests/grid/test_slurm.py and on the test cluster)."""

from __future__ import annotations

import pytest
import torch

from gridrun.train.distributed import Dist, device_report

ENV = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}


def test_a_rank_seeing_both_gpus_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(RuntimeError, match=r"^rank 1/2 sees 2 GPUs \(CUDA_VISIBLE_DEVICES=0,1\): each rank must see "
                                           r"exactly its own.*launcher=slurm"):
        Dist.from_env({**ENV, "CUDA_VISIBLE_DEVICES": "0,1"})


def test_local_rank_1_runs_on_its_one_visible_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # Not device 1 of the node: its only visible device, whichever physical GPU that is.
    assert Dist(rank=1, world=2, local_rank=1).device == torch.device("cuda", 0)


def test_a_cpu_rank_reports_where_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    report = device_report(Dist(rank=1, world=2, local_rank=1))
    assert (report["rank"], report["world"], report["cuda_visible_devices"], report["device"]) == (1, 2, "1", "cpu")
    assert report["gpu_uuid"] is None and report["gpu_total_gb"] is None
