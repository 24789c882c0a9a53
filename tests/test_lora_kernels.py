"""The update's fused LoRA layers (gridrun/train/cpu/lora_kernels.py) against peft's own: the same
outputs, the same update (metrics, every adapter's gradient, old log-probs) to float rounding,
and peft's forward wherever the merge would not be the same function."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from gridrun.train import update as update_module
from gridrun.train.cpu.lora_kernels import LoraLinear, fused_lora
from tests.test_packed import _model, _step, assert_same_update


def _peft_only(monkeypatch: pytest.MonkeyPatch) -> None:
    @contextlib.contextmanager
    def unfused(_model: Any) -> Iterator[int]:
        yield 0

    monkeypatch.setattr(update_module, "fused_lora", unfused)


@pytest.mark.parametrize("roles", [
    {"generator": "shared", "evaluator": "shared", "aggregator": "shared"},
    {"generator": "generator", "evaluator": "evaluator"},
], ids=["SP", "IP"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_the_fused_update_equals_peft_s(roles: dict[str, str], checkpointing: bool,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # Mini-batches of 8 rows: several optimizer steps per adapter, so the old-log-prob pass
    # (no gradient) runs on moved weights too.
    fused = _step(roles, True, 100_000, 8, monkeypatch, checkpointing)
    _peft_only(monkeypatch)
    peft = _step(roles, True, 100_000, 8, monkeypatch, checkpointing)
    assert_same_update(fused, peft)


def test_the_closed_form_backward_is_autograd_s() -> None:
    # float64, a scaling that is not a power of two: the closed form against autograd through
    # the unmerged expression, to double rounding.
    torch.manual_seed(0)
    x, weight = torch.randn(2, 5, 12, dtype=torch.float64, requires_grad=True), torch.randn(7, 12, dtype=torch.float64)
    a = torch.randn(3, 12, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, a, b: LoraLinear.apply(x, weight, a, b, 1.7), (x, a, b))
    out = LoraLinear.apply(x, weight, a, b, 1.7)
    torch.testing.assert_close(out, x @ weight.t() + (x @ a.t() @ b.t()) * 1.7)


def test_fused_lora_swaps_float32_lora_layers_and_steps_aside_where_peft_must_run() -> None:
    model = _model(("one", "two"))
    ids = torch.randint(1, 500, (2, 9))
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with model.disable_adapter():
            base = model(input_ids=ids).logits
        with fused_lora(model) as swapped:
            assert swapped == 14  # 2 layers x 7 projections
            torch.testing.assert_close(model(input_ids=ids).logits, plain, rtol=1e-5, atol=1e-5)
            with model.disable_adapter():  # the reference pass: the base model, exactly peft's
                assert torch.equal(model(input_ids=ids).logits, base)
    assert not any("forward" in m.__dict__ for m in model.modules())  # peft's forward is back
    assert not torch.equal(plain, base)

    # Half precision is never merged: W + sBA would round the adapter into bf16.
    with fused_lora(_model(("one",)).to(torch.bfloat16)) as swapped:
        assert swapped == 0


def test_the_rollout_s_merge_is_peft_s_to_the_bit_and_refuses_a_non_finite_adapter() -> None:
    from peft.tuners.lora import Linear as PeftLoraLinear

    from gridrun.train.cpu.lora_kernels import merged_weight, plain_float32_lora

    model = _model(("one", "two"))
    layers = [m for m in model.modules() if isinstance(m, PeftLoraLinear)]
    assert layers and all(plain_float32_lora(layer) for layer in layers)
    for layer in layers:
        weight = layer.get_base_layer().weight
        original, storage = weight.detach().clone(), weight.data_ptr()
        ours = merged_weight(layer, "two")
        assert torch.equal(weight, original) and weight.data_ptr() == storage  # W itself is untouched
        layer.merge(safe_merge=True, adapter_names=["two"])
        assert torch.equal(ours, layer.get_base_layer().weight.data)
        layer.unmerge()
    with torch.no_grad():
        layers[0].lora_B["one"].weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="adapter one has non-finite weights"):
        merged_weight(layers[0], "one")
    assert not plain_float32_lora(_model(("one",)).to(torch.bfloat16).base_model.model.model.layers[0].mlp.up_proj)
