"""Quantized weights held as tensor subclasses (torchao's ``quantize_`` with a weight-only
configuration): the weight is read as the tensors it stores, and its dequantization is
written out as ops of the program, so the kernels that read the weight load the integer
data and dequantize it in registers.

A weight that ``quantize_`` replaced is a wrapper tensor: it reports the float dtype and
the shape of the weight it stands for, and holds its parts (``__tensor_flatten__``).
The layouts read here are torchao's plain affine ones:

- ``Int8Tensor`` (``Int8WeightOnlyConfig``, per row or per group of columns) and
  ``IntxUnpackedToInt8Tensor`` (``IntxWeightOnlyConfig``: int1-int8 values stored one to
  an int8): ``qdata`` int8 ``[N, K]``, ``scale`` and ``zero_point`` one per block of
  ``block_size``; the weight is ``(qdata.to(f) - zero_point.to(f)) * scale`` per block, as
  torchao's ``dequantize_affine`` computes it (in the promoted dtype, then cast to ``f``).
- ``Float8Tensor`` (``Float8WeightOnlyConfig``, per row by default): ``qdata``
  float8_e4m3fn (or e5m2) ``[N, K]`` and a float32 ``scale`` one per block; the weight is
  ``(qdata.to(float32) * scale).to(f)``, as torchao's ``_dequantize_affine_float8``
  computes it. Weight-only: one with ``act_quant_kwargs`` (fp8 activations) is refused.

The program computes what the weight's ``dequantize()`` gives, read by the op as a float
weight. torchao's own ``Int8Tensor`` linear, per row or per tensor, multiplies by the scale
after an ``mm`` with the int8 values instead (and leaves a zero point out there): the two
differ by rounding, and by the zero point's term where one is not zero.

Each part becomes a program input fed from source ``("inner", (weight's source, part))``
(``torch_masks.source_value`` reads it from the weight at each call). A subclass this module
cannot read (packed int4 layouts, activation quantization) raises
``UnsupportedOpError`` naming the weight, its class and why: the ops reading it run
eagerly.
"""

from __future__ import annotations

from typing import Any

import torch

from ..ir.errors import DTypeError, MirageError, UnsupportedOpError
from ..ir.node import canonical_dtype
from .graph import Tensor

__all__ = ["AFFINE_LAYOUTS", "dequantized", "is_wrapped"]

AFFINE_LAYOUTS = ("Int8Tensor", "IntxUnpackedToInt8Tensor")  # torchao's plain affine ones
FLOAT8_LAYOUTS = ("Float8Tensor",)  # fp8 qdata times a float32 scale (weight-only)
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def is_wrapped(value: Any) -> bool:
    """Whether ``value`` is a wrapper tensor subclass holding other tensors (a quantized
    weight), not a plain (or fake) tensor."""
    return isinstance(value, torch.Tensor) and hasattr(type(value), "__tensor_flatten__") \
        and not isinstance(value, torch._subclasses.fake_tensor.FakeTensor)


def _describe(value: Any) -> str:
    cls = type(value)
    return f"{cls.__module__.split('.')[0]}.{cls.__name__}"


def _parts(name: str, value: Any) -> tuple[dict[str, torch.Tensor], dict]:
    """The tensors and attributes of wrapper ``value``; refuses what is not one of
    torchao's weight-only layouts read here (by class name and torchao's module)."""
    what = f"weight {name!r} ({_describe(value)})"
    cls = type(value)
    if cls.__name__ not in AFFINE_LAYOUTS + FLOAT8_LAYOUTS or \
            not cls.__module__.startswith("torchao."):
        raise UnsupportedOpError(f"{what}: a tensor subclass eqsat-mirage cannot read (it "
                                 f"reads torchao's quantized weights "
                                 f"{', '.join(AFFINE_LAYOUTS + FLOAT8_LAYOUTS)})")
    names, ctx = value.__tensor_flatten__()
    parts = {n: getattr(value, n) for n in names}
    extra = [n for n in parts if n not in ("qdata", "scale", "zero_point")]
    if extra or ctx.get("act_quant_kwargs") or ctx.get("activation_quantization"):
        raise UnsupportedOpError(f"{what}: it quantizes the activations too "
                                 f"({', '.join(extra) or 'act_quant_kwargs'}); eqsat-mirage "
                                 "reads weight-only quantization")
    fp8 = type(value).__name__ in FLOAT8_LAYOUTS
    if "qdata" not in parts or "scale" not in parts or parts["qdata"].dtype not in (
            _FP8 if fp8 else (torch.int8,)):
        raise UnsupportedOpError(f"{what}: expected {'float8' if fp8 else 'int8'} qdata and "
                                 f"a scale, got parts {sorted(parts)}")
    return parts, ctx


def _blocks(name: str, value: Any, ctx: dict) -> tuple[int, ...]:
    """The number of quantization blocks along each axis (scale's shape), or an error."""
    shape = tuple(int(d) for d in value.shape)
    block = tuple(int(b) for b in ctx.get("block_size") or ())
    if len(block) != len(shape) or any(b <= 0 or d % b for d, b in zip(shape, block)):
        raise UnsupportedOpError(f"weight {name!r} ({_describe(value)}): block size "
                                 f"{list(block)} does not tile its shape {list(shape)}")
    if len(shape) != 2 or block[0] not in (1, shape[0]):
        raise UnsupportedOpError(f"weight {name!r} ({_describe(value)}): blocks of "
                                 f"{list(block)} on shape {list(shape)}; eqsat-mirage reads 2-D "
                                 "weights quantized per row, per group of a row or per tensor")
    return tuple(d // b for d, b in zip(shape, block))


def dequantized(make_input: Any, name: str, value: Any, source: tuple,
                label: str | None = None) -> Tensor:
    """The dequantized weight of wrapper ``value`` as ops on new inputs (``make_input(name,
    shape, dtype, source)`` makes one): ``(q.to(f) - z.to(f)) * s`` blockwise, in the
    dtype torch promotes ``f`` and the scale's dtype to, then cast to ``f`` (torchao's
    ``dequantize_affine``). Raises ``UnsupportedOpError`` for a layout it cannot read, naming
    the weight ``label`` (default ``name``)."""
    parts, ctx = _parts(label or name, value)
    groups = _blocks(label or name, value, ctx)
    n, k = (int(d) for d in value.shape)
    f = str(value.dtype).removeprefix("torch.")

    what = f"weight {label or name!r} ({_describe(value)})"

    def part(key: str) -> Tensor:
        t = parts[key]
        shape = tuple(int(d) for d in t.shape)
        # qdata as the weight; a scale or zero point one per block, in the blocks' order
        # (size-1 axes aside): a transposed or differently laid out part is refused
        want = (n, k) if key == "qdata" else tuple(g for g in groups if g != 1)
        if (shape if key == "qdata" else tuple(d for d in shape if d != 1)) != want:
            raise UnsupportedOpError(f"{what}: {key} has shape {list(shape)}, not "
                                     + ("the weight's" if key == "qdata" else
                                        f"one per block ({groups[0]} x {groups[1]})"))
        try:
            dtype = canonical_dtype(str(t.dtype).removeprefix("torch."))
        except MirageError as exc:
            raise DTypeError(f"{what}: its {key}: {exc}") from None
        return make_input(f"{name}_{key}", shape, dtype, ("inner", (source, key)))

    def per_block(t: Tensor) -> Tensor:  # broadcastable against the weight's block view
        shape = (groups[0], 1) if groups[1] == 1 else (groups[0], groups[1], 1)
        return t if t.shape == shape else t.reshape(*shape)  # a reshape is a kernel: none

    fp8 = type(value).__name__ in FLOAT8_LAYOUTS  # (q.to(float32) * scale).to(f), blockwise
    w = part("qdata").astype("float32" if fp8 else f)
    if groups[1] > 1:
        w = w.reshape(n, groups[1], k // groups[1])
    if parts.get("zero_point") is not None:
        w = w - per_block(part("zero_point")).astype(f)
    w = w * per_block(part("scale"))
    if groups[1] > 1:
        w = w.reshape(n, k)
    return w if w.dtype == f else w.astype(f)
