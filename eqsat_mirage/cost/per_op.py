"""Extraction's view of the cost model: one kernel per kernel-level op.

``node_cost_us`` is ``gpucost.op_cost``, the one price of a lone op that the
fusion planner and the one-kernel-per-op baseline use too (so the same op has
the same price everywhere). ``Hardware`` names the profile's headline figures.
Figures come from a hardware profile in extract/ (``target=`` names one or
gives a path).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..ir.node import Node
from .gpucost import op_cost
from .profile import GPUProfile


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
    profile: GPUProfile | None = field(default=None, compare=False, repr=False)

    @classmethod
    def load(cls, target: str | Path = "h100") -> Hardware:
        """Load a profile by name (extract/NAME.toml) or from a .toml path.

        Parsing, validation and calibration are ``GPUProfile.load``'s; this model
        reads the few figures it needs from it.
        """
        prof = GPUProfile.load(target)
        return cls(prof.name, **{k: getattr(prof, k) for k in (
            "dram_bandwidth_GBps", "fp16_tensor_TFLOPs", "fp32_cuda_TFLOPs", "sms",
            "smem_per_sm_KiB", "launch_overhead_us")}, profile=prof)

def node_cost_us(node: Node, hw: Hardware) -> float:
    """Predicted time of one op run as its own kernel, in microseconds (``gpucost.op_cost``)."""
    return op_cost(node, hw.profile or GPUProfile.load(hw.name)).time_us


def graph_cost_us(program, hw: Hardware) -> float:
    """Cost of a program run one kernel per op (shared subterms paid once)."""
    return sum(node_cost_us(n, hw) for n in program.nodes())
