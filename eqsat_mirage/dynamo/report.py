"""What the backend did with each partition: ``PartitionReport``, and the summaries read
from the reports (the pieces the time limit cut short, how each partition launched)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..frontend.graph import Graph

__all__ = ["PartitionReport", "launch_summary", "ran_out_of_time"]


@dataclass
class PartitionReport:
    """What the backend did with one partition of a Dynamo graph."""

    name: str
    ops: list[str]
    status: str = "pending"  # "optimized"; else it runs eagerly (see reason): "unchanged"
    # (the search found nothing better), "fallback" (something failed) or "eager"
    reason: str = ""
    graph: Graph | None = field(default=None, repr=False)
    result: Any = field(default=None, repr=False)  # the OptimizeResult
    seconds: float = 0.0  # conversion + optimization (+ compilation)
    mode: str = ""  # "triton" or "torch" once it ran optimized
    calls: int = 0
    eager_calls: int = 0  # calls whose sizes the program does not serve (they ran eagerly)
    replan: str = ""  # a second search, when a call moved a size Dynamo left symbolic
    optimized_ops: int = 0  # its ops whose piece was optimized (all of them: one piece)
    optimized_compute_ops: int = 0  # those of them that compute (``specs.computes``)
    module: Any = field(default=None, repr=False)  # the OptimizedPartition running it


def ran_out_of_time(entry: PartitionReport) -> list[str]:
    """The pieces of a partition (or the partition itself, searched as one piece) whose
    search the time limit cut short, in words: ``part_1_0 piece 2 (18 ops: mm, silu, ...)``."""
    res = entry.result
    if res is None or isinstance(res, BaseException):
        return []
    pieces = res.stats.get("pieces")
    if pieces is None:
        if entry.status == "unchanged" and res.stats.get("time_limited"):
            return [f"{entry.name} ({len(entry.ops)} ops)"]
        return []
    out = []
    for p in pieces:  # a piece equal to an earlier one (same_as) was not searched again
        if p.get("time_limited") and p.get("same_as") is None:
            names = list(dict.fromkeys(p["ops"]))
            shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
            equal = [q["index"] for q in pieces if q.get("same_as") == p["index"]]
            also = (f"; and the equal piece(s) {', '.join(map(str, equal))}" if equal else "")
            out.append(f"{entry.name} piece {p['index']} ({len(p['ops'])} ops: {shown}{also})")
    return out


def launch_summary(report: list[PartitionReport]) -> dict:
    """``launches``: how each optimized partition launched so far, in words ("CUDA graph:
    1 captured, 9 replays", "plain launches: a shape family ...", ``OptimizedPartition
    .launches``); ``cuda_graphs``: the partitions replayed as CUDA graphs."""
    launches = {e.name: e.module.launches() for e in report
                if e.status == "optimized" and e.module is not None}
    return {"launches": launches,
            "cuda_graphs": [n for n, how in launches.items() if how.startswith("CUDA graph")]}
