"""``OptimizeResult``, what ``em.optimize`` returns, and its plain-data form for the cache.

``to_data``/``from_data`` turn a result into JSON-able data and back: the chosen
program as MuGraph JSON (``mugraph.io.to_dict``) or, at ``level="kernel"``, as
Graph JSON (``graph_to_dict``), the figures, the verifier's verdict and the
JSON-able part of ``stats``. Nothing in it is code: loading parses and validates,
never imports or executes. The candidates and the fusion plan are not kept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..ir.errors import MirageError
from ..verifier.verify import VerifyResult

if TYPE_CHECKING:  # annotations only
    from ..egraph.extract import Candidate
    from ..frontend.graph import Graph
    from ..fusion.plans import FusionPlan
    from ..mugraph.program import MuGraph
    from ..partition.pieces import Piece
    from .records import SearchRecord

FORMAT = 1  # the version of to_data's layout


@dataclass
class OptimizeResult:
    """What ``em.optimize`` found: the chosen program, its cost and how it was found.

    Built by keyword by the pipeline. ``stats`` is a read-only view of the figures the
    passes recorded (``records.py``; plain data, kept for compatibility: the typed
    records are ``passes``); the pipeline adds entries with ``record``."""

    program: MuGraph | Graph
    cost_us: float
    baseline_cost_us: float
    verified: VerifyResult | None
    stats: Mapping[str, Any] = field(default_factory=dict)
    candidates: list[Candidate] = field(default_factory=list)  # extracted, cheapest first
    source: Graph | None = None  # the program optimized
    roofline_us: float | None = None  # the roofline lower bound (mugraph level)
    plan: FusionPlan | None = None  # the chosen program's fusion plan (mugraph level)
    passes: SearchRecord | None = None  # the search's records (None: a cache hit, a whole)
    # a whole program's pieces: (partition.Piece, optimized?) each, its ops the input's nodes
    pieces: list[tuple[Piece, bool]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # the entries themselves (the dict the search writes while it finishes) and the
        # read-only view of them that users see
        entries = self.stats if type(self.stats) is dict else dict(self.stats)
        self._entries = entries
        self.stats = MappingProxyType(entries)

    def record(self, **entries) -> None:
        """Add ``entries`` to ``stats`` (the pipeline's own: the cache's verdict, ...)."""
        self._entries.update(entries)

    def drop(self, *keys: str) -> None:
        """Remove ``keys`` from ``stats`` where present (a foreign cache entry's figures
        that no check confirms)."""
        for k in keys:
            self._entries.pop(k, None)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["stats"] = dict(state.pop("_entries"))
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__post_init__()

    @property
    def speedup(self) -> float:
        """Baseline cost over chosen cost (cost-model figures)."""
        return self.baseline_cost_us / self.cost_us if self.cost_us else float("inf")

    def _mugraph(self):
        from ..mugraph.program import MuGraph, from_graph

        return self.program if isinstance(self.program, MuGraph) else from_graph(self.program)

    def _header(self) -> str:
        from ..codegen.tiles import named

        name = named(getattr(self.source, "name", "program"))
        return (f"eqsat-mirage: optimized {name} for {self.stats.get('target', '?')}; "
                f"predicted {self.cost_us:.2f} us (one kernel per op: "
                f"{self.baseline_cost_us:.2f} us); verified: {self.verified}")

    def triton_source(self, reuse_outputs: bool = False) -> str:
        """A Python module with one @triton.jit kernel per custom kernel and a ``run`` launcher
        (``reuse_outputs``: as in ``compile``)."""
        from ..codegen.source import triton_source

        return triton_source(self._mugraph(), header=self._header(), reuse_outputs=reuse_outputs)

    def reference(self):
        """The input program the compiled one is checked against: the Graph optimized
        (``source``), else the chosen program itself."""
        from ..mugraph.program import MuGraph

        src = self.source
        if src is not None and not isinstance(src, MuGraph) and hasattr(src, "nodes") and \
                not getattr(src, "dynamic", None):
            return src
        return self.program

    def compile(self, cuda_graph: bool = False, reuse_outputs: bool = False,
                check: bool = True):
        """The chosen program as a callable on torch tensors (by position or by input name).

        On a CPU, set ``TRITON_INTERPRET=1`` before triton is imported. ``reuse_outputs``:
        the tensors the Triton kernels write (outputs and intermediates; a pre-defined torch
        op's result is still new each call) are allocated once per input signature and every
        later call with that signature writes and returns the
        same tensors, overwriting what the previous call returned (``clone()`` them to keep
        them); it saves the allocations' host time. ``cuda_graph``: on CUDA inputs, capture
        the launches once per input signature and replay them
        (``runtime.graphs.GraphRunner``; the returned outputs are then reused buffers,
        overwritten by the next call). ``check``: the first call with each input signature
        also runs the input program through torch and compares the outputs (dtype
        tolerance, finite wherever the input's are); a mismatch raises
        ``LaunchCheckError`` naming the output, its kernel and the worst element
        (``runtime.check``, against ``reference()`` run by torch). ``check=False`` skips it.
        An output that is a view of an input in the program (a transpose, a slice) is
        returned as a contiguous copy, not a view (one that is an input itself, or a
        reshape of one, may be that tensor): a later write to the input does not show in it.
        """
        from ..codegen.source import compile_mugraph
        from ..semantics.torch_reference import checked_against

        mg = self._mugraph()
        run = compile_mugraph(mg, header=self._header(), reuse_outputs=reuse_outputs)
        if check:
            run = checked_against(run, self.reference(), list(run.module.INPUTS), mugraph=mg)
        if not cuda_graph:
            return run
        from ..runtime.graphs import GraphRunner

        return GraphRunner(run, list(run.module.INPUTS))

    def render(self, path, **kwargs):
        """Draw the input program and the chosen program side by side (.svg, .png or .pdf).

        Kernels, their block graphs, grids and loops, with device-memory tensors,
        shared-memory tiles and register values told apart, and the cost model's
        time per kernel for this result's target. Keywords go to ``render.render``
        (``backend="auto"|"graphviz"|"matplotlib"``, ``title``). Returns the path.
        """
        from ..render.draw import render

        kwargs.setdefault("cost", self.stats.get("target_spec", "h100"))
        return render(self.program, path, source=self.source, **kwargs)

    def __str__(self) -> str:
        st = self.stats
        roof = (f"; roofline {self.roofline_us:.2f} us ({self.cost_us / self.roofline_us:.2f}x)"
                if self.roofline_us else "")
        lines = [f"optimized {getattr(self.source, 'name', 'program')!r} for "
                 f"{st.get('target', '?')}: {self.baseline_cost_us:.2f} us -> "
                 f"{self.cost_us:.2f} us ({self.speedup:.2f}x, cost model){roof}"]
        if "pieces" in st:  # a whole program: one line per piece
            lines += ["  " + line for line in format_pieces(st["pieces"])]
            lines.append(f"  verified: {self.verified}")
            lines.append(str(self.program))
            return "\n".join(lines)
        for ph in st.get("phases", []):
            lines.append(f"  phase {ph['name']:<10} {ph['iterations']:>3} iterations "
                         f"{ph['enodes']:>8} e-nodes {ph['seconds']:7.2f} s  ({ph['stop']})")
        lines.append(f"  extraction: {st.get('candidates', 0)} candidates in "
                     f"{st.get('extract_seconds', 0):.2f} s; verified: {self.verified}")
        lines += [f"  rejected by the verifier: {why}" for why in st.get("rejected", [])]
        if "fusion_seconds" in st:
            lines.append(f"  fusion: {len(st.get('plans', []))} MuGraphs planned in "
                         f"{st['fusion_seconds']:.2f} s; chosen: {st.get('kernels', '?')} kernels "
                         f"({st.get('custom_kernels', 0)} custom)")
            lines += [f"  region {r.splitlines()[0]}" for r in st.get("regions", [])]
        lines.append(str(self.program))
        return "\n".join(lines)


def _ops(ops: list[str]) -> str:
    counts: dict[str, int] = {}
    for op in ops:
        counts[op] = counts.get(op, 0) + 1
    return ", ".join(f"{op} x{n}" if n > 1 else op for op, n in counts.items())


def format_pieces(pieces: list[dict]) -> list[str]:
    """One line per piece of a whole program (``stats["pieces"]``): status, ops, cost
    before and after, bound, and the reason or where the result came from."""
    out = []
    for e in pieces:
        before, after = e.get("cost_before_us"), e.get("cost_after_us")
        cost = (f"{before:8.2f} -> {after:8.2f} us" if before is not None and after is not None
                else f"{'-':>8}    {'-':>8}   ")
        if e["status"] == "optimized":
            bound = f"bound {e['bound']:.1e}" if e.get("bound") is not None else ""
            how = (f"same as piece {e['same_as']}" if e.get("same_as") is not None else
                   f"{e.get('seconds', 0.0):.1f} s, cache {e.get('cache', 'off')}")
            tail = f"{bound}  ({how})"
        else:
            tail = f"unchanged: {e['reason']}"
        out.append(f"piece {e['index']:>2}  {e['status']:<9} {len(e['ops']):>3} ops  {cost}  "
                   f"{tail}  [{_ops(e['ops'])}]")
    return out


class ResultDataError(MirageError):
    """Stored result data that does not parse, validate or match its program."""


_VERDICT = ("equivalent", "false_positive_bound", "trials", "p", "q", "per_trial_bound",
            "seconds", "float_checked", "reason", "inconclusive", "max_bound", "native_checked")


def _jsonable(value: Any, depth: int = 0) -> tuple[bool, Any]:
    """(True, a JSON-able copy) of nested dicts/lists/tuples of plain values, else (False, None)."""
    if depth > 32:
        return False, None
    if value is None or isinstance(value, bool | int | str):
        return True, value
    if isinstance(value, float):
        return True, value if math.isfinite(value) else repr(value)
    if isinstance(value, list | tuple):
        out = []
        for v in value:
            ok, v = _jsonable(v, depth + 1)
            if not ok:
                return False, None
            out.append(v)
        return True, out
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        out = {}
        for k, v in value.items():
            ok, v = _jsonable(v, depth + 1)
            if not ok:
                return False, None
            out[k] = v
        return True, out
    return False, None


def to_data(res: OptimizeResult) -> dict:
    """``res`` as plain JSON-able data (stats entries that are not plain data are left out
    and named in ``stats["cache_dropped"]``)."""
    from ..mugraph.io import graph_to_dict, to_dict
    from ..mugraph.program import MuGraph

    stats, dropped = {}, []
    for k, v in res.stats.items():
        ok, v = _jsonable(v)
        if ok and isinstance(k, str):
            stats[k] = v
        else:
            dropped.append(str(k))
    if dropped:
        stats["cache_dropped"] = dropped
    kind = "mugraph" if isinstance(res.program, MuGraph) else "graph"
    program = to_dict(res.program) if kind == "mugraph" else graph_to_dict(res.program)
    verdict = None
    if res.verified is not None:
        verdict = {k: getattr(res.verified, k) for k in _VERDICT}
        verdict["primes"] = [list(pq) for pq in res.verified.primes]
        verdict["false_positive_bound"] = float(verdict["false_positive_bound"])
    return {"format": FORMAT, "kind": kind, "program": program, "cost_us": res.cost_us,
            "baseline_cost_us": res.baseline_cost_us, "roofline_us": res.roofline_us,
            "verified": verdict, "stats": stats}


def _number(data: dict, key: str, optional: bool = False) -> float | None:
    v = data.get(key)
    if v is None and optional:
        return None
    if not isinstance(v, int | float) or isinstance(v, bool) or not v >= 0:
        raise ResultDataError(f"{key} is {v!r}, not a number >= 0")
    return float(v)


def _verdict(d: Any) -> VerifyResult | None:
    if d is None:
        return None
    if not isinstance(d, dict) or set(d) != set(_VERDICT) | {"primes"}:
        raise ResultDataError("the verifier's verdict is malformed")
    types = {f.name: f.type for f in fields(VerifyResult)}
    for k in _VERDICT:
        want = {"bool": bool, "int": int, "float": (int, float), "str": str}[types[k]]
        if not isinstance(d[k], want) or (want is int and isinstance(d[k], bool)):
            raise ResultDataError(f"the verdict's {k} is {d[k]!r}")
    primes = d["primes"]
    if not isinstance(primes, list) or not all(
            isinstance(pq, list) and len(pq) == 2 and all(isinstance(x, int) for x in pq)
            for pq in primes):
        raise ResultDataError("the verdict's primes are malformed")
    return VerifyResult(**{k: d[k] for k in _VERDICT}, primes=[tuple(pq) for pq in primes])


def _same_interface(program, graph) -> None:
    for kind in ("inputs", "outputs"):
        mine, theirs = getattr(program, kind), getattr(graph, kind)
        if set(mine) != set(theirs):
            raise ResultDataError(f"its {kind} {sorted(mine)} are not the program's "
                                  f"{sorted(theirs)}")
    for name, node in graph.inputs.items():
        other = program.inputs[name]
        if (other.shape, other.dtype) != (node.shape, node.dtype):
            raise ResultDataError(f"input {name!r} is {other.dtype}{list(other.shape)}, the "
                                  f"program's is {node.dtype}{list(node.shape)}")
    shapes = {n: v.shape for n, v in program.outputs.items()}
    for name, node in graph.outputs.items():
        if tuple(shapes[name]) != node.shape:
            raise ResultDataError(f"output {name!r} has shape {list(shapes[name])}, the "
                                  f"program's {list(node.shape)}")


def from_data(data: Any, graph) -> OptimizeResult:
    """The ``OptimizeResult`` that ``to_data`` wrote for ``graph``, parsed and validated.

    The program must load and validate (``MuGraph.from_dict``/``graph_from_dict`` and
    ``check``) and have ``graph``'s inputs (names, shapes, dtypes) and outputs (names,
    shapes). Raises ``ResultDataError`` otherwise.
    """
    from ..ir.check import check
    from ..mugraph.io import graph_from_dict
    from ..mugraph.program import MuGraph

    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ResultDataError(f"not result data of format {FORMAT}")
    try:
        if data.get("kind") == "mugraph":
            program = MuGraph.from_dict(data["program"]).validate()
        elif data.get("kind") == "graph":
            program = graph_from_dict(data["program"])
            check(program)
        else:
            raise ResultDataError(f"unknown program kind {data.get('kind')!r}")
    except ResultDataError:
        raise
    except (MirageError, ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise ResultDataError(f"its program does not load: {type(exc).__name__}: {exc}") from exc
    _same_interface(program, graph)
    stats = data.get("stats")
    if not isinstance(stats, dict):
        raise ResultDataError("stats are not a mapping")
    return OptimizeResult(program=program, cost_us=_number(data, "cost_us"),
                          baseline_cost_us=_number(data, "baseline_cost_us"),
                          verified=_verdict(data.get("verified")), stats=dict(stats),
                          source=graph, roofline_us=_number(data, "roofline_us", optional=True))
