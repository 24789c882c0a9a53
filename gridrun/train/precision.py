"""Which floating-point dtypes this CPU computes natively, and the check that keeps the CPU
path off the slow ones.

Reduced precision is a choice (`model.dtype`), and on a CPU it is only a saving where the
instruction set has it: without AVX512-BF16 or AMX (x86) or the BF16 extension (Arm), torch
emulates bfloat16 matmuls, about 17x slower than float32 (measured: one 128->512 Linear,
forward and backward on 2,560 rows, 46 ms float32 against 798 ms bf16 autocast on an AVX2-only
EPYC); float16 likewise needs AVX512-FP16/AMX-FP16 or Arm's half-precision arithmetic. So a
CPU run in a dtype the CPU lacks is refused, naming the fix, unless the user opts in.

Left out: GPUs (every supported GPU computes bf16 natively) and autocast, which nothing in
gridrun's CPU path uses.
"""

from __future__ import annotations

import os
import platform
from functools import cache
from pathlib import Path

# Opt-in to a dtype this CPU emulates (for a correctness check, accepting the cost).
ALLOW_EMULATED = "GRIDRUN_ALLOW_EMULATED_DTYPE"

# Feature flags (/proc/cpuinfo) that give a dtype native matmuls, per architecture.
_NATIVE_FLAGS = {
    "bfloat16": {"avx512_bf16", "amx_bf16", "bf16"},
    "float16": {"avx512_fp16", "amx_fp16", "fphp", "asimdhp"},
}


class EmulatedDtype(RuntimeError):
    pass


@cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as Linux reports them (x86 'flags', Arm 'Features'); empty elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def native_on_cpu(dtype: str, flags: frozenset[str] | None = None) -> bool:
    """Whether this CPU computes `dtype` natively (float32 always does)."""
    if dtype == "float32":
        return True
    if flags is None:
        flags = cpu_flags()
    return bool(_NATIVE_FLAGS.get(dtype, set()) & flags)


def check_cpu_dtype(dtype: str, flags: frozenset[str] | None = None) -> None:
    """Refuse a CPU run in a dtype this CPU only emulates, naming the fix and the opt-in."""
    if native_on_cpu(dtype, flags) or os.environ.get(ALLOW_EMULATED) == "1":
        return
    raise EmulatedDtype(
        f"model.dtype={dtype} on this CPU ({platform.machine()}, no native {dtype} instructions) would run "
        f"about 17x slower than float32: set model.dtype=float32, or {ALLOW_EMULATED}=1 to run it emulated anyway"
    )
