"""The CPU path never runs a dtype the CPU only emulates, unless asked by name."""

from __future__ import annotations

import pytest

from gridrun.train.precision import ALLOW_EMULATED, EmulatedDtype, check_cpu_dtype, native_on_cpu

# Flags as /proc/cpuinfo prints them: an AVX2-only EPYC (Zen 1), a Sapphire Rapids Xeon, an Arm Neoverse V1.
ZEN1 = frozenset(["fpu", "sse2", "avx", "avx2", "fma", "f16c"])
SAPPHIRE_RAPIDS = frozenset(["avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile"])
NEOVERSE_V1 = frozenset(["fp", "asimd", "fphp", "asimdhp", "bf16", "sve"])


def test_native_dtypes_follow_the_cpu_flags() -> None:
    assert native_on_cpu("float32", ZEN1) and native_on_cpu("float32", frozenset())
    assert not native_on_cpu("bfloat16", ZEN1) and not native_on_cpu("float16", ZEN1)
    assert native_on_cpu("bfloat16", SAPPHIRE_RAPIDS) and native_on_cpu("float16", SAPPHIRE_RAPIDS)
    assert native_on_cpu("bfloat16", NEOVERSE_V1) and native_on_cpu("float16", NEOVERSE_V1)


def test_an_emulated_dtype_is_refused_naming_the_fix_and_the_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOW_EMULATED, raising=False)
    with pytest.raises(EmulatedDtype, match=rf"model.dtype=bfloat16 .* set model.dtype=float32, or {ALLOW_EMULATED}=1"):
        check_cpu_dtype("bfloat16", ZEN1)
    check_cpu_dtype("bfloat16", SAPPHIRE_RAPIDS)
    check_cpu_dtype("float32", ZEN1)
    monkeypatch.setenv(ALLOW_EMULATED, "1")
    check_cpu_dtype("bfloat16", ZEN1)


def test_loading_a_model_on_cpu_checks_its_dtype(monkeypatch: pytest.MonkeyPatch, toy_world) -> None:
    from gridrun.seam.runconfig import ModelSpec, ToySpec
    from gridrun.train import precision
    from gridrun.train.model import ModelLoadError, load_base

    monkeypatch.delenv(ALLOW_EMULATED, raising=False)
    monkeypatch.setattr(precision, "cpu_flags", lambda: ZEN1)
    with pytest.raises(ModelLoadError, match="set model.dtype=float32"):
        load_base(ModelSpec(name_or_path="toy", dtype="bfloat16", toy=ToySpec()), str(toy_world))
