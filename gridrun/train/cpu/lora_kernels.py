"""LoRA without peft's per-call machinery: the update's fused layers and the rollout's merge.

Both apply to peft's plain LoRA Linear in float32 (`plain_float32_lora`); anything else
(half precision, DoRA or another variant, a LoRA bias, the fan-in-fan-out layout) keeps
peft's own code.

**The rollout's merge** (`merged_weight`, used by the HF engine): W + (BA) s computed as
peft's `merge` computes it, the same operations in the same order, so the same bits, without
its per-layer bookkeeping and the clone of W it then adds to (a fifth of a millisecond a layer:
more than the product on the toy world).

**The update's layers.** peft's LoRA Linear computes `base(x) + B(A(dropout(x))) * s`:
three matrix products, then a multiply and an add over the whole (tokens, out) output, each
with its own backward, behind a Python wrapper that checks its arguments on every call. On the
toy world's update those elementwise passes and the wrapper were about a tenth of the update.
`LoraLinear` computes the same function as one product with the merged weight, and its
backward in closed form (x: (N, in), W: (out, in), A: (r, in), B: (out, r), s the scaling):

    y  = x (W + s BA)^T
    dx = dy (W + s BA)          dB = s dy^T (x A^T)          dA = s (dy B)^T x

W + s BA is rebuilt from the live A and B in the forward and again in the backward (one
(out, r, in) product each, small beside the (N, out, in) ones), never kept: what the backward
holds is what peft's holds (x, and x A^T). The same function and gradients as peft's to float
rounding (tests/test_lora_kernels.py).

`fused_lora(model)` swaps it in for the plain float32 LoRA layers without dropout (in bf16,
W + s BA would round the adapter's delta into the base weight's 8-bit mantissa, as the HF
engine's merge notes). At each call a layer falls back to peft's own forward unless exactly
one adapter is active and the layer is neither merged nor disabled (the reference pass runs
the base model through `disable_adapter`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from peft.tuners.lora import Linear as PeftLoraLinear


class LoraLinear(torch.autograd.Function):
    """x (..., in), weight (out, in), lora_a (r, in), lora_b (out, r) -> (..., out)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                scaling: float) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])  # (N, in)
        merged = torch.addmm(weight, lora_b, lora_a, alpha=scaling)  # (out, in)
        # x A^T (N, r) is what B's gradient needs; without one it is not computed.
        down = flat @ lora_a.t() if ctx.needs_input_grad[3] else None
        ctx.save_for_backward(flat, down, weight, lora_a, lora_b)
        ctx.scaling, ctx.x_shape = scaling, x.shape
        return torch.nn.functional.linear(flat, merged).view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, torch.Tensor | None,
                                                         torch.Tensor | None, None]:
        flat, down, weight, lora_a, lora_b = ctx.saved_tensors
        dy = grad.reshape(-1, grad.shape[-1])  # (N, out)
        s = ctx.scaling
        dx = da = db = None
        if ctx.needs_input_grad[0]:
            dx = (dy @ torch.addmm(weight, lora_b, lora_a, alpha=s)).view(ctx.x_shape)
        if ctx.needs_input_grad[2]:
            da = ((dy @ lora_b).t() @ flat).mul_(s)  # (r, in)
        if ctx.needs_input_grad[3]:
            db = (dy.t() @ down).mul_(s)  # (out, r)
        return dx, None, da, db, None


def plain_float32_lora(layer: Any) -> bool:
    """Whether `layer` is peft's LoRA Linear on an `nn.Linear`, every adapter plain LoRA (no
    variant, no bias, no fan-in-fan-out layout) and every weight float32."""
    if type(layer) is not PeftLoraLinear or layer.fan_in_fan_out:
        return False
    base = layer.get_base_layer()
    if type(base) is not torch.nn.Linear or base.weight.dtype != torch.float32:
        return False
    if base.bias is not None and base.bias.dtype != torch.float32:
        return False
    for name in layer.lora_A:
        a, b = layer.lora_A[name], layer.lora_B[name]
        if name in layer.lora_variant or layer.lora_bias[name] or a.bias is not None or b.bias is not None:
            return False
        if a.weight.dtype != torch.float32 or b.weight.dtype != torch.float32:
            return False
    return True


def merged_weight(layer: Any, adapter: str) -> torch.Tensor:
    """W + (B A) s of a `plain_float32_lora` layer as a new tensor, bit for bit peft's merge
    (its delta (B A) s, added to W); W is untouched. Refuses a non-finite adapter, as peft's
    safe merge does."""
    delta = (layer.lora_B[adapter].weight @ layer.lora_A[adapter].weight) * layer.scaling[adapter]
    if not bool(torch.isfinite(delta).all()):
        raise ValueError(f"adapter {adapter} has non-finite weights: it cannot be served")
    return layer.get_base_layer().weight.data + delta


def _fusable(layer: Any) -> bool:
    return plain_float32_lora(layer) and all(isinstance(d, torch.nn.Identity) for d in layer.lora_dropout.values())


def _fused_forward(layer: Any) -> Any:
    peft_forward = layer.forward

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        active = layer.active_adapters
        if (args or kwargs or layer.disable_adapters or layer.merged or len(active) != 1
                or active[0] not in layer.lora_A):
            return peft_forward(x, *args, **kwargs)
        base = layer.get_base_layer()
        name = active[0]
        out = LoraLinear.apply(x, base.weight, layer.lora_A[name].weight, layer.lora_B[name].weight,
                               layer.scaling[name])
        return out if base.bias is None else out + base.bias

    return forward


@contextlib.contextmanager
def fused_lora(model: Any) -> Iterator[int]:
    """Run `model`'s eligible LoRA layers through `LoraLinear` inside the block; yields how
    many were swapped (0 for a model without adapters or in half precision)."""
    layers = [m for m in model.modules() if isinstance(m, PeftLoraLinear) and _fusable(m)]
    # An instance's own forward (none, unless a caller patched one) is put back afterwards.
    previous = [layer.__dict__.get("forward") for layer in layers]
    for layer in layers:
        layer.forward = _fused_forward(layer)
    try:
        yield len(layers)
    finally:
        for layer, forward in zip(layers, previous):
            if forward is None:
                layer.__dict__.pop("forward", None)
            else:
                layer.forward = forward
