"""Data parallelism over the tasks of one job: rank, world size, and the few collectives the
trainer needs, in one small `Dist` object.

How a step is split, so that the update means exactly what it means in one process:
- Every rank draws the same problems (same sampler state) and rolls out a contiguous block
  of them (`shard`), all n episodes of each: a GRPO group never spans two ranks.
- Outcomes (problem id, reward, ...) are gathered in rank order, which is the
  single-process order, so advantages and reward metrics are computed over the whole step.
- The update gathers every rank's sequences (with their old log-probs), shuffles them with
  the shared RNG and cuts the same global mini-batches as one process would; each rank
  computes the gradient of its stride of every mini-batch with loss weights from the
  mini-batch's global token and sequence counts, and the gradients are summed across ranks
  (`all_reduce_grads`) before the optimizer step. Every rank then takes the same step.
- Rank 0 alone writes the run directory (state, metrics, checkpoints, samples).
- A stop request (SIGUSR2: the scheduler's warning before preemption or the time limit) is
  agreed on at step boundaries (`should_stop`), so every rank stops after the same step.

The world comes from the environment, in torchrun's names (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT): the SLURM launcher's job sets them from submitit's
JobEnvironment, and CUDA_VISIBLE_DEVICES to exactly the task's GPU. A rank of several that
sees more or fewer than one GPU (on a CUDA machine) is refused: its vLLM engine would take
the first visible device whatever the trainer's. No WORLD_SIZE, or 1, is a single process: every method is then the
identity and no process group is created, so a local run behaves exactly as without it.

Devices: a rank runs on `cuda:0`, its one visible GPU, whatever its local rank, and its
rollout engine shares that GPU (rollout and update alternate; vLLM sleeps during the update).
One visible device per process, rather than vLLM's `external_launcher` (which would tie
vLLM's own process group to the trainer's torchrun world): the engine must share the GPU
with the trainer anyway, tensor parallel 1 needs no cross-rank engine group, and "which
device" becomes a property of the process environment that torch, NCCL, vLLM's executor and
the sandbox's children all read the same way. Nothing passes a device index, and nothing can
fall back to device 0 of the node. A cell planned for GPUs whose torch sees none fails at
once, naming why (`require_gpus`).

Backend: nccl when CUDA is available, else gloo; beside nccl, `gather` pickles objects over a
gloo group, so that no gather takes GPU memory (validation's runs while the rollout engine
holds its share: gridrun/memory.py). Left out: several nodes per cell (the
paper uses one 2-GPU node), FSDP/sharded parameters (LoRA adapters are small; each rank
holds the whole model), overlapping communication with compute.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import signal
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import torch

from gridrun.seam.errors import UserError
from gridrun.train.seeds import Stream, derive

log = logging.getLogger("gridrun")
T = TypeVar("T")
# Seconds a rank waits for the others at a collective before giving up (a dead peer).
TIMEOUT_S = 1800


class NoGpu(UserError, RuntimeError):
    """A cell planned for GPUs sees none: one line saying why, before anything runs on the CPU."""


def require_gpus(planned: int, env: dict[str, str] | None = None) -> None:
    """Stop a cell planned for `planned` GPUs (cell.json's resources.gpus) that sees none,
    naming why: a CPU-only torch build, or a CUDA one the driver or the allocation gives no
    GPU. Without this its ranks would fall back to gloo on the CPU and die much later inside
    vLLM. A cell planned with gpu=cpu (0) runs anywhere."""
    if planned <= 0 or torch.cuda.is_available():
        return
    env = dict(os.environ if env is None else env)
    if torch.version.cuda is None:
        why = (f"its torch {torch.__version__} is a CPU-only build: install the CUDA build into the job's venv "
               "(`make install-cluster` in gridrun's checkout)")
    else:
        why = (f"torch (CUDA {torch.version.cuda}) sees no GPU (CUDA_VISIBLE_DEVICES="
               f"{env.get('CUDA_VISIBLE_DEVICES', 'unset')}): check that the job was given GPUs (--gpus-per-task in "
               "its sbatch script) and that `nvidia-smi` works on the node")
    raise NoGpu(f"this cell was planned for {planned} GPU(s) but {why}; to run it on CPU, plan it with gpu=cpu")


def free_local_port() -> int:
    """A TCP port free on 127.0.0.1 right now, for a process group of processes on this machine."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    # Set by the SIGUSR2 handler: stop after the current step, with a checkpoint.
    stop_requested: bool = field(default=False, compare=False)
    # Seconds spent in `gather` so far (the cross-rank exchange of outcomes and sequences,
    # waiting for the slowest rank included); the trainer reads it per step.
    gather_s: float = field(default=0.0, compare=False)
    # The group `gather` pickles objects over: a gloo (CPU) group beside an nccl world, so a
    # gather (validation's episodes, while the rollout engine is awake) takes no GPU memory;
    # None: the default group (gloo already, or one process).
    object_group: Any = field(default=None, compare=False, repr=False)

    # --- setup -----------------------------------------------------------------------------
    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, backend: str | None = None) -> Dist:
        """The world of this process; creates the process group when there are several ranks.

        backend: None picks nccl where CUDA is available, else gloo; work that stays on the
        CPU (the toy world's build) names gloo, also on a GPU node."""
        env = dict(os.environ if env is None else env)
        world = int(env.get("WORLD_SIZE", "1"))
        dist = cls(rank=int(env.get("RANK", "0")), world=world, local_rank=int(env.get("LOCAL_RANK", "0")))
        if world > 1 and not torch.distributed.is_initialized():
            if "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
                raise RuntimeError(
                    f"WORLD_SIZE={world} but MASTER_ADDR/MASTER_PORT are not set: start the ranks with the "
                    "SLURM launcher (or torchrun), or unset WORLD_SIZE to run one process"
                )
            if torch.cuda.is_available() and torch.cuda.device_count() != 1:
                raise RuntimeError(
                    f"rank {dist.rank}/{world} sees {torch.cuda.device_count()} GPUs "
                    f"(CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', 'unset')}): each rank must see exactly its "
                    "own, which its trainer and rollout engine share; start the ranks with launcher=slurm (one task "
                    "per GPU) or set CUDA_VISIBLE_DEVICES per rank"
                )
            backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
            if backend == "nccl":
                torch.cuda.set_device(dist.device)
            torch.distributed.init_process_group(
                backend,
                init_method=f"tcp://{env['MASTER_ADDR']}:{env['MASTER_PORT']}",
                rank=dist.rank,
                world_size=world,
                timeout=timedelta(seconds=TIMEOUT_S),
            )
            if backend == "nccl":
                # Every rank creates it, in the same order, right after the world.
                dist.object_group = torch.distributed.new_group(backend="gloo")
            log.info("rank %d/%d: torch.distributed up (%s)", dist.rank, world, backend)
        return dist

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        """This rank's device: its GPU when CUDA is available, else the CPU. A rank of several
        sees exactly one GPU (from_env refuses otherwise), so it is the process's first; one
        process alone on a node with several takes the first too, as its vLLM engine does."""
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")

    def close(self) -> None:
        if self.world > 1 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    # --- splitting work --------------------------------------------------------------------
    def shard(self, items: Sequence[T]) -> list[T]:
        """This rank's contiguous block of `items` (sizes differ by at most one)."""
        size, extra = divmod(len(items), self.world)
        start = self.rank * size + min(self.rank, extra)
        return list(items[start : start + size + (1 if self.rank < extra else 0)])

    def stride(self, items: Sequence[T]) -> list[T]:
        """Every world-th item from this rank's index: its part of one global mini-batch."""
        return list(items[self.rank :: self.world])

    # --- collectives (the identity on one rank) --------------------------------------------
    def gather(self, items: list[T]) -> tuple[list[T], slice]:
        """Every rank's `items` concatenated in rank order, and where this rank's sit in it."""
        if self.world == 1:
            return items, slice(0, len(items))
        parts: list[Any] = [None] * self.world
        started = time.perf_counter()
        torch.distributed.all_gather_object(parts, items, group=self.object_group)
        self.gather_s += time.perf_counter() - started
        start = sum(len(part) for part in parts[: self.rank])
        return [item for part in parts for item in part], slice(start, start + len(items))

    def all_reduce_grads(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Sum every parameter's gradient across ranks (None counts as zeros), in place."""
        if self.world == 1:
            return
        params = list(params)
        grads = []
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        flat = torch.cat([g.reshape(-1) for g in grads])
        torch.distributed.all_reduce(flat)
        offset = 0
        for grad in grads:
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()

    def all_reduce_tensors(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """The element-wise sums across ranks of same-shaped tensor lists (new tensors)."""
        if self.world == 1 or not tensors:
            return tensors
        flat = torch.cat([t.reshape(-1).float() for t in tensors])
        torch.distributed.all_reduce(flat)
        out, offset = [], 0
        for t in tensors:
            out.append(flat[offset : offset + t.numel()].view(t.shape).to(t.dtype))
            offset += t.numel()
        return out

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        """Sums of scalars across ranks (float64)."""
        if self.world == 1:
            return values
        buf = torch.tensor(values, dtype=torch.float64, device=self._comm_device)
        torch.distributed.all_reduce(buf)
        return buf.tolist()

    def should_stop(self) -> bool:
        """Whether any rank was asked to stop (call at a step boundary, on every rank)."""
        # The run entry blocks SIGUSR2 (`gridrun.cellrun.usr2_stops`): one that every thread blocked
        # waits pending until taken here.
        if not self.stop_requested and signal.SIGUSR2 in signal.sigpending():
            signal.sigtimedwait([signal.SIGUSR2], 0)
            self.stop_requested = True
        if self.world == 1:
            return self.stop_requested
        return self.all_reduce_sum([1.0 if self.stop_requested else 0.0])[0] > 0

    @property
    def _comm_device(self) -> torch.device:
        return self.device if torch.distributed.get_backend() == "nccl" else torch.device("cpu")

    # --- RNG and checks --------------------------------------------------------------------
    def decorrelate_rng(self, seed: int, step: int) -> None:
        """Give ranks > 0 their own sampling stream (rank 0 keeps the single-process one).
        Call after the model is built (adapter init must match) and after a resume."""
        if self.rank:
            torch.manual_seed(derive(seed, Stream.RANK, self.rank, step))

    def digest(self, params: Iterable[torch.Tensor]) -> str:
        """A short hash of parameter values, to check that every rank holds the same weights."""
        h = hashlib.sha256()
        for p in params:
            h.update(p.detach().float().cpu().numpy().tobytes())
        return h.hexdigest()[:16]


def free_gpu_gb(device: torch.device) -> float | None:
    """Free memory of a GPU device, GiB, as the driver sees it (every process on it); None
    on the CPU."""
    if device.type != "cuda":
        return None
    return torch.cuda.mem_get_info(device)[0] / 2**30


def return_cached_memory(device: torch.device) -> None:
    """Give the GPU memory PyTorch's allocator holds but no tensor uses back to the driver:
    the allocator keeps every freed block (the update's peak among them) for its own reuse,
    invisible to another process on the GPU. Nothing on the CPU."""
    if device.type != "cuda":
        return
    # Tensors held only by reference cycles (a failed step's traceback) go first.
    gc.collect()
    torch.cuda.empty_cache()


def reserved_gb(device: torch.device, peak: bool = False) -> float | None:
    """GiB this process's allocator holds on the GPU (its peak since `reset_peak_reserved`
    with `peak`); None on the CPU."""
    if device.type != "cuda":
        return None
    return (torch.cuda.max_memory_reserved(device) if peak else torch.cuda.memory_reserved(device)) / 2**30


def reset_peak_reserved(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def gpu_uuid(device: torch.device) -> str | None:
    """The GPU's UUID as nvidia-smi spells it (GPU-...); None on the CPU."""
    if device.type != "cuda":
        return None
    uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", "") or "")
    return (uuid if uuid.startswith("GPU-") else f"GPU-{uuid}") if uuid else None


def device_report(dist: Dist) -> dict[str, Any]:
    """Where this rank runs: host, CUDA_VISIBLE_DEVICES (its rollout engine inherits it), the
    trainer's device and, on a GPU, its UUID, name and memory (RunDir's RANK_FIELDS)."""
    device = dist.device
    report: dict[str, Any] = {
        "rank": dist.rank, "world": dist.world, "host": socket.gethostname(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "device": str(device),
        "gpu_uuid": None, "gpu_name": None, "gpu_total_gb": None,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        report.update(gpu_uuid=gpu_uuid(device), gpu_name=props.name, gpu_total_gb=props.total_memory / 2**30)
    return report
