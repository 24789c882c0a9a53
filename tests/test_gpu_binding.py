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


def test_each_rank_of_a_node_compiles_vllm_into_its_own_gpus_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM puts every tensor-parallel-1 engine's compilation in <root>/.../rank_0_0: the two
    # ranks of a node would write one folder at once. Each rank's GPU (its UUID, which the
    # trainer reads as device_report does) names its own folder under vLLM's root.
    from gridrun.train.distributed import gpu_uuid
    from gridrun.train.engines.compile_cache import vllm_cache_root

    uuids = iter(["aaaa-0", "GPU-bbbb-1"])

    class Props:
        def __init__(self) -> None:
            self.uuid = next(uuids)

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Props())
    rank0, rank1 = gpu_uuid(torch.device("cuda", 0)), gpu_uuid(torch.device("cuda", 0))
    assert (rank0, rank1) == ("GPU-aaaa-0", "GPU-bbbb-1") and gpu_uuid(torch.device("cpu")) is None
    home = {"HOME": "/home/u"}
    assert vllm_cache_root(home, rank0) == "/home/u/.cache/vllm/GPU-aaaa-0"
    assert vllm_cache_root(home, rank1) == "/home/u/.cache/vllm/GPU-bbbb-1"
    # Under the root vLLM itself would take: XDG_CACHE_HOME, else a VLLM_CACHE_ROOT the site set.
    assert vllm_cache_root({**home, "XDG_CACHE_HOME": "/fast"}, rank0) == "/fast/vllm/GPU-aaaa-0"
    site = {**home, "XDG_CACHE_HOME": "/fast", "VLLM_CACHE_ROOT": "/scratch/vllm"}
    assert vllm_cache_root(site, rank0) == "/scratch/vllm/GPU-aaaa-0"
    # A second engine in the same process (the variable already set for its GPU) keeps it.
    assert vllm_cache_root({**site, "VLLM_CACHE_ROOT": "/scratch/vllm/GPU-aaaa-0"}, rank0) == "/scratch/vllm/GPU-aaaa-0"
