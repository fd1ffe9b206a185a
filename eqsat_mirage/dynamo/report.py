"""What the backend did with each graph and partition: ``PartitionReport`` (one partition,
or one graph that ran eagerly as a whole), ``GraphRecord`` (one graph: its summary dict and
its warning, read from its partitions' reports when asked, so a partition that falls back
at run time is counted as eager from then on) and the summaries read from the reports
(the pieces the time limit cut short, how each partition launched)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..frontend.graph import Graph

__all__ = ["GraphRecord", "PartitionReport", "launch_summary", "ran_out_of_time"]


@dataclass
class PartitionReport:
    """What the backend did with one partition of a Dynamo graph (or, named ``graph_N``
    with every op of the graph, with a graph that runs eagerly as a whole)."""

    name: str
    ops: list[str]
    status: str = "pending"  # "optimized"; else it runs eagerly (see reason): "unchanged"
    # (the search found nothing better), "fallback" (something failed, at search time or
    # at its first call) or "eager" (never searched)
    reason: str = ""
    graph: Graph | None = field(default=None, repr=False)
    result: Any = field(default=None, repr=False)  # the OptimizeResult
    seconds: float = 0.0  # conversion + optimization (+ compilation)
    mode: str = ""  # "triton" or "torch" once it ran optimized
    calls: int = 0
    eager_calls: int = 0  # calls that ran eagerly (sizes or values the program does not
    # serve, a folded buffer written, an index out of range)
    eager_why: str = ""  # why the first of those ran eagerly
    replan: str = ""  # a second search, when a call moved a size Dynamo left symbolic
    optimized_ops: int = 0  # its ops whose piece was optimized (all of them: one piece)
    optimized_compute_ops: int = 0  # those of them that compute (``specs.computes``)
    time_limited_compute_ops: int = 0  # compute ops left as they were by the time limit only
    module: Any = field(default=None, repr=False)  # the OptimizedPartition running it
    share_s: float | None = None  # its share of the graph's time limit (None: no limit)
    weight: float = 0.0  # its expected search cost (``limits.search_weight``), the share's


def _seconds(value: float | None) -> str:
    return "no limit" if value is None else f"{value:.1f} s"


def ran_out_of_time(entry: PartitionReport) -> list[str]:
    """The pieces of a partition (or the partition itself, searched as one piece) whose
    search the time limit cut short, in words, each with its own share of the time and
    what it spent: ``part_1_0 piece 2 (18 ops: mm, silu, ...; share 4.0 s of the
    partition's 9.0 s, spent 4.1 s)``."""
    res = entry.result
    if res is None or isinstance(res, BaseException):
        return []
    pieces = res.stats.get("pieces")
    if pieces is None:
        if entry.status == "unchanged" and res.stats.get("time_limited"):
            return [f"{entry.name} ({len(entry.ops)} ops; share {_seconds(entry.share_s)}, "
                    f"spent {entry.seconds:.1f} s)"]
        return []
    out = []
    for p in pieces:  # a piece equal to an earlier one (same_as) was not searched again
        if p.get("time_limited") and p.get("same_as") is None:
            names = list(dict.fromkeys(p["ops"]))
            shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
            equal = [q["index"] for q in pieces if q.get("same_as") == p["index"]]
            also = (f"; and the equal piece(s) {', '.join(map(str, equal))}" if equal else "")
            share = p.get("share_s")
            spent = (f"share {share:.1f} s of the partition's {_seconds(entry.share_s)}, "
                     f"spent {p.get('seconds') or 0.0:.1f} s" if share is not None else
                     f"the partition's share {_seconds(entry.share_s)}, spent "
                     f"{entry.seconds:.1f} s in all")
            out.append(f"{entry.name} piece {p['index']} ({len(p['ops'])} ops: {shown}; "
                       f"{spent}{also})")
    return out


def launch_summary(report: list[PartitionReport]) -> dict:
    """``launches``: how each optimized partition launched so far, in words ("CUDA graph:
    1 captured, 9 replays", "plain launches: a shape family ...", ``OptimizedPartition
    .launches``); ``cuda_graphs``: the partitions replayed as CUDA graphs."""
    launches = {e.name: e.module.launches() for e in report
                if e.status == "optimized" and e.module is not None}
    return {"launches": launches,
            "cuda_graphs": [n for n, how in launches.items() if how.startswith("CUDA graph")],
            "eager_calls": eager_calls(report)}


def mostly_eager(entry: PartitionReport) -> bool:
    """Whether most calls of an optimized partition ran eagerly (sizes or values its program
    does not serve, a search again that found nothing): summaries then count it as eager,
    not optimized (a growing KV cache's partition optimized for its first length only)."""
    return entry.status == "optimized" and entry.eager_calls > entry.calls


def counted(entry: PartitionReport) -> bool:
    """Whether summaries count ``entry`` as optimized: optimized, and not ``mostly_eager``."""
    return entry.status == "optimized" and not mostly_eager(entry)


def _ran_eagerly(entry: PartitionReport) -> str:
    """How many of ``entry``'s calls ran eagerly, in words: ``5 of 6 calls ran eagerly``."""
    return f"{entry.eager_calls} of {entry.calls + entry.eager_calls} calls ran eagerly"


def eager_calls(report: list[PartitionReport]) -> list[str]:
    """One line per optimized partition some of whose calls ran eagerly (sizes or values
    the program does not serve): how many of its calls, and why the first did."""
    return [f"{e.name}: {_ran_eagerly(e)} ({e.eager_why})" for e in report
            if e.status == "optimized" and e.eager_calls]


@dataclass
class GraphRecord:
    """One graph the backend compiled: its ``number``, its call ops (``ops``) and those
    of them that compute (``compute_ops``), its partitions' reports (``entries``), the ops
    left eager outside every partition with why (``eager``), its sizes in words, its time
    limit, ``refused``: why the whole graph runs eagerly ("" when it was partitioned), and
    ``folded``: the ops computed once at compile time (``folding``), not in ``ops``.
    ``summary()`` and ``warning()`` read the reports when called: a partition whose first
    call failed counts as fallen back, not optimized, and so does one most of whose calls
    ran eagerly (``mostly_eager``)."""

    number: int
    ops: int
    compute_ops: int
    entries: list[PartitionReport]
    eager: list[str]
    sizes: str = "static"
    time_limit_s: float | None = None
    refused: str = ""
    folded: list[str] = field(default_factory=list)

    def outcome(self) -> tuple[str, str]:
        """``(outcome, reason)``: "optimized" (every op in an optimized partition),
        "partly optimized" or "eager", and why for the last two."""
        done = [e for e in self.entries if counted(e)]
        if self.refused:
            return "eager", self.refused
        if not done:
            if not self.entries:
                shown = self.eager[:4] + (["..."] if len(self.eager) > 4 else [])
                return "eager", f"no partition to search; eager: {', '.join(shown)}"
            return "eager", "no partition optimized: " + "; ".join(
                f"{e.name}: " + (f"{_ran_eagerly(e)} ({e.eager_why})" if mostly_eager(e)
                                 else f"{e.status} ({e.reason})") for e in self.entries)
        left = self.eager_items()
        if left or sum(e.optimized_ops for e in done) < self.ops:
            return "partly optimized", f"{len(left)} op(s) or partition(s) eager (see eager)" \
                if left else "some pieces of the optimized partitions kept as they were"
        return "optimized", ""

    def eager_items(self) -> list[str]:
        """What runs eagerly, with why: the ops outside every partition and each partition
        not optimized (now: one that fell back at its first call included, and one most of
        whose calls ran eagerly)."""
        return self.eager + [
            f"partition {e.name} of {len(e.ops)} ops ("
            + (f"{_ran_eagerly(e)}: {e.eager_why}" if mostly_eager(e) else e.reason) + ")"
            for e in self.entries if not counted(e)]

    def summary(self) -> dict:
        """This graph's dict in ``Backend.summary()["graphs"]``; ``predicted_us`` is None
        where nothing was priced (no partition optimized)."""
        done = [e for e in self.entries if counted(e)]
        outcome, reason = self.outcome()
        predicted = [sum(e.result.baseline_cost_us for e in done),
                     sum(e.result.cost_us for e in done)] if done else None
        return {"graph": self.number, "outcome": outcome, "reason": reason,
                "ops": self.ops, "compute_ops": self.compute_ops,
                "optimized_ops": sum(e.optimized_ops for e in done),
                "optimized_compute_ops": sum(e.optimized_compute_ops for e in done),
                "partitions": 0 if self.refused else len(self.entries),
                "optimized_partitions": len(done),
                "time_limited": [t for e in self.entries for t in ran_out_of_time(e)],
                "time_limited_compute_ops": sum(e.time_limited_compute_ops
                                                for e in self.entries),
                "predicted_us": predicted, "eager": self.eager_items(),
                "sizes": self.sizes, "time_limit_s": self.time_limit_s,
                "folded": list(self.folded)}

    def warning(self) -> str:
        """The graph's one warning: ``N of M ops in K optimized partitions (predicted X us
        -> Y us)``, or ``(not priced: ...)`` where nothing was optimized, then the symbolic
        sizes, what stayed eager and the pieces the time limit cut short."""
        s = self.summary()
        if self.refused:
            return f"graph {self.number} ({self.ops} ops) runs eagerly: {self.refused}"
        eager = s["eager"]
        shown = eager[:8] + ([f"... and {len(eager) - 8} more"] if len(eager) > 8 else [])
        price = (f"predicted {s['predicted_us'][0]:.2f} us -> {s['predicted_us'][1]:.2f} us"
                 if s["predicted_us"] else "not priced: nothing optimized")
        late = s["time_limited"]
        return (f"{s['optimized_ops']} of {self.ops} ops in {s['optimized_partitions']} "
                f"optimized partitions ({price})"
                + (f"; {self.sizes}, one search serves every value"
                   if self.sizes != "static" else "")
                + (f"; {len(self.folded)} ops folded to constants at compile time (computed "
                   "from no graph input)" if self.folded else "")
                + (f"; eager: {', '.join(shown)}" if shown else "")
                + (f"; ran out of time (graph time_limit_s={self.time_limit_s}, shared by "
                   f"expected search cost; kept as they were): {', '.join(late)}"
                   if late else ""))
