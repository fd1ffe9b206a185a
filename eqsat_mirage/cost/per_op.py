"""The FLOP/byte cost model used by extraction (one kernel per kernel-level op).

Per op: launch overhead + max(DRAM bytes / bandwidth, FLOPs / peak), with
tensor-core peak for matmuls and CUDA-core peak for elementwise work and
reductions. Reshapes and constants are free. Figures come from a hardware
profile in extract/ (``target=`` names one or gives a path).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..ir.node import ELEMENTWISE, ITEMSIZE, OPAQUE, Node, Op, numel
from .profile import GPUProfile

# CUDA-core FLOPs per element: exp and the opaque functions go through the SFU
_FLOPS_PER_ELEM = {Op.EXP: 4, Op.SILU: 6, Op.SQRT: 4, Op.RSQRT: 4, Op.DIV: 2}


@dataclass(frozen=True)
class Hardware:
    """The figures of one GPU the cost model needs."""

    name: str
    dram_bandwidth_GBps: float  # noqa: N815 - unit in the name
    fp16_tensor_TFLOPs: float  # noqa: N815
    fp32_cuda_TFLOPs: float  # noqa: N815
    sms: int
    smem_per_sm_KiB: float  # noqa: N815
    launch_overhead_us: float

    @classmethod
    def load(cls, target: str | Path = "h100") -> Hardware:
        """Load a profile by name (extract/NAME.toml) or from a .toml path.

        Parsing, validation and calibration are ``GPUProfile.load``'s; this model
        reads the few figures it needs from it.
        """
        prof = GPUProfile.load(target)
        return cls(prof.name, **{k: getattr(prof, k) for k in (
            "dram_bandwidth_GBps", "fp16_tensor_TFLOPs", "fp32_cuda_TFLOPs", "sms",
            "smem_per_sm_KiB", "launch_overhead_us")})

def _bytes(node: Node) -> int:
    return numel(node.shape) * ITEMSIZE[node.dtype] if node.op is not Op.CONST else 0


def node_cost_us(node: Node, hw: Hardware) -> float:
    """Predicted time of one op run as its own kernel, in microseconds."""
    op = node.op
    if op in (Op.INPUT, Op.CONST, Op.RESHAPE):
        return 0.0
    moved = _bytes(node) + sum(_bytes(s) for s in node.srcs)
    mem_us = moved / (hw.dram_bandwidth_GBps * 1e3)
    if op is Op.MATMUL:
        k = node.srcs[0].shape[-1]
        flops = 2.0 * numel(node.shape) * k
        comp_us = flops / (hw.fp16_tensor_TFLOPs * 1e6)
    elif op in ELEMENTWISE or op in OPAQUE or op in (Op.SUM, Op.MEAN):
        elems = max(numel(node.shape), max((numel(s.shape) for s in node.srcs), default=0))
        comp_us = elems * _FLOPS_PER_ELEM.get(op, 1) / (hw.fp32_cuda_TFLOPs * 1e6)
    else:  # transpose, concat: pure data movement
        comp_us = 0.0
    return hw.launch_overhead_us + max(mem_us, comp_us)


def graph_cost_us(program, hw: Hardware) -> float:
    """Cost of a program run one kernel per op (shared subterms paid once)."""
    return sum(node_cost_us(n, hw) for n in program.nodes())
