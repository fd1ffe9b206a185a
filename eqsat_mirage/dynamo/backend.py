"""``torch.compile(model, backend=em.backend)``: eqsat-mirage as a Dynamo backend.

``backend`` is a ``Backend`` object. Called by Dynamo as ``backend(gm, example_inputs)``
it partitions the fx graph into the largest supported subgraphs (torch.fx's
``CapabilityBasedPartitioner``, with an operator support built from the same table
as ``from_torch``: a node is supported when the ``Converter`` converts it to the
shape and dtype Dynamo recorded), converts each partition into an ``em.Graph``,
runs ``em.optimize`` on it and puts a callable in its place:

- on CUDA tensors, and on CPU tensors with ``TRITON_INTERPRET=1``, the compiled
  Triton program (``res.compile()``);
- otherwise (CPU) a torch implementation of the chosen program (``torch_reference``).
On CUDA inputs a static partition's launches replay as one CUDA graph after its checked
first launch (``cuda_graph``; ``replay``: what is copied, what is captured); a shape family
launches plainly, and ``summary()["launches"]`` says how each partition launched.

Everything else runs as eager torch. In-place updates of a tensor the graph created
(``x += y``, ``-=``, ``*=``, ``/=``, ``add_``, ``sub_``, ``mul_``, ``div_``, ``masked_fill_``,
``copy_``) are first rewritten as their functional forms (``frontend.inplace``); a whole graph
that still mutates a tensor in place (a graph input, a parameter or buffer, a view of one, a
tensor whose view is read after the write, ``setitem``, ``inplace=True``) runs eagerly, the
warning naming the write and why: moving ops into a partition could move a read across it.

Symbolic sizes (``dynamic=True``, or the sizes automatic dynamic shapes mark after a
recompile) become shape families (``specs.SymbolicSizes``): the symbol with the largest
hint is the family's ``em.Dim`` (one search serves every value), sizes that guards pin
are numbers, and other symbols are specialized at their hint and checked on every call.
A call that moves a specialized size searches once more with that size symbolic; a call
the program still does not serve runs eagerly. A node whose size is a formula of a
symbolic one (``s0 + 1`` from a ``torch.cat``), family or specialized, stays eager, and its
consumers form the family at that size (a KV cache's length after the cat: the attention
over it searches again when the cache grows, once, and serves every later step).
Under torch.compile's defaults (automatic dynamic shapes) a graph without symbolic sizes
runs its first call eagerly and is searched at its second (``Backend``'s ``warmup``):
Dynamo replaces a graph whose sizes change before then.
A partition whose conversion, optimization or compilation fails (any exception,
e.g. a ``MirageError`` or one from Triton) runs eagerly ("fallback"), and so does
one for which the search found nothing better than its input ("unchanged"): only
a partition that runs a verified, cheaper program is labelled "optimized". With
autograd needed (grad enabled and an input that requires grad) the whole graph runs
eagerly, with a warning: the generated kernels have no backward. Called with
keywords only, ``backend(target="h100", time_limit_s=2, ...)`` returns a new
``Backend`` with those options, checked when it is built (``options.check_options``: an
unknown keyword or a bad value raises a ``MirageError`` naming the option).

Module buffers, which Dynamo passes as graph inputs, are constants: an op computed from
buffers alone is folded in torch when the graph is searched, so a comparison of a buffer
(nanoGPT's ``att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))``) becomes the
causal mask built from positions, or a constant bool mask (``frontend.torch_masks``);
every call checks that the buffer still holds the value folded (the same storage and
version counter, else equal elements) and runs eagerly when it does not.
Each compiled graph gets one warning, ``eqsat-mirage: N of M ops in K optimized
partitions (predicted X us -> Y us); eager: op at file:line (reason), ...``, ending with
``ran out of time (...): part piece i (n ops: ...)`` when the time limit cut some search
short (those pieces run as they were; the pieces that verified in time run optimized).
The partitions of one graph share ``time_limit_s`` by their expected search cost
(``limits.search_weight`` of the ops each converts to: matmuls and reductions weigh more),
each getting the time left times its weight over the weights not yet searched, so time one
leaves unused goes to the next and the compile call holds the limit. The warning also lists
the ops torch.fx's partitioner put in no partition; a graph nothing was optimized in says
"not priced". ``warn=False`` silences it, and ``Backend.summary()`` returns the same as a
dict (totals, with ``compute_ops``: the ops computing a non-empty float tensor, and one
entry per graph, ``report.GraphRecord``, with its outcome and reason: every graph the
backend compiled is there, one that ran eagerly as a whole too, and a partition that fell
back at its first call counts as eager). ``Backend.report`` lists a ``PartitionReport`` per
partition (and one per graph that runs eagerly as a whole); ``Backend.unsupported`` names
the ops that stayed eager and why. Nodes that
produce or read a zero-size tensor (an empty KV cache) stay eager with that reason; nodes
that produce a tuple of tensors (``split``, ``chunk``) join partitions like any other.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import torch
from torch import fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

from ..frontend.from_torch import Converter, op_name, source_line, unique_identifier
from ..frontend.graph import Graph, Tensor
from ..frontend.inplace import functionalize
from ..frontend.quantized import is_wrapped
from ..frontend.torch_masks import BoolMask
from ..frontend.torch_movement import Empty
from ..ir.errors import MirageError, unexpected
from ..ir.limits import AUTO, Shares, resolve_time_limit
from ..pipeline.optimize import optimize
from ..pipeline.whole import improved, unchanged_reason
from ..verifier import blas
from .folding import Folded, fold_constants
from .options import check_options
from .replay import CopyEscaping, graphs_backend
from .report import GraphRecord, PartitionReport, launch_summary
from .runtime import OptimizedPartition, Warmup, uses_triton
from .specs import SymbolicSizes, computes, graph_work, node_spec, recorded, split_runs
from .support import (
    CONSTANTS,
    NodeSupport,
    buffer_constants,
    constant_input,
    left_out,
    mutation,
    optimized_ops,
    retarget_tensor_indexing,
    served,
    symbolic_view_sizes,
    time_limited_ops,
)

__all__ = ["Backend", "PartitionReport", "backend", "mutation", "node_spec"]

_PREFIX = "eqsat_mirage_part_"
# one fx node that is a whole attention: worth a partition of its own (min_ops aside)
_COMPOSITE = frozenset({torch.nn.functional.scaled_dot_product_attention})


def launch_mode(graph, cuda_graph) -> str:
    """How a partition's kernels will launch, which prices each launch (``optimize``'s
    ``launch``): "graph" where the backend replays it as a CUDA graph (``cuda_graph`` on and
    every size fixed), else "plain" (a shape family, or ``cuda_graph=False``)."""
    return "graph" if cuda_graph and not graph.is_family else "plain"


AUTO_BASE_S = 300.0  # time_limit_s="auto": the cap of a graph of toy size (a cap: searches
#   stop on work done, so a busy machine gives the same partitions, later)


class Backend:
    """The ``torch.compile`` backend (see the module docstring); ``backend`` is one.

    Options: ``target`` (hardware profile), ``time_limit_s`` (wall-clock bound on
    the search of one compiled graph, its partitions together; "auto", the default: 300 s
    for a graph of toy size, more for a large one, ``limits.auto_time_limit``: 130 float64
    evaluations of it at this machine's measured rate on top, at most 1800 s; the value
    used is in ``summary()``'s graphs; a cap: searches stop on work done), ``min_ops`` (smallest
    partition to optimize, in ops), ``warn`` (each graph's summary warning, and warnings
    on fallbacks at run time),
    ``warmup`` (see below), ``size_hint`` and ``size_max`` (the family size's planning hint
    and maximum: a decode loop that starts short is planned, priced and verified for the
    lengths it grows to, and a call past the maximum runs eagerly; default: the example
    value, no maximum; under ``dynamic=True`` the family size is the symbol with the
    largest example value, under automatic dynamic shapes the size that changed), and any
    other
    ``em.optimize`` keyword (``level``, ``node_limit``, ``rules``, ...), all checked here
    (``options.check_options``). ``cuda_graph``: True (default): CUDA graph replay on CUDA
    inputs (``replay``); False: plain launches; or a graphs backend (``CudaGraphs``'s methods).

    ``build(gm, sizes, number)`` searches one graph and returns its callable;
    ``warming``: the graphs still in their ``warmup`` calls; ``warning(text)``: a warning
    unless ``warn=False`` (``runtime.Warmup`` uses the three).

    ``warmup``: a graph without symbolic sizes runs eagerly for its first ``warmup`` calls
    and is searched at the next one. Default (None): 1 for a graph Dynamo compiles while
    its automatic dynamic shapes are on (``torch.compile``'s default), else 0. Under
    automatic dynamic shapes, a
    graph whose sizes change is replaced, before its second call, by a graph with those
    sizes symbolic (one search as a shape family serves it), so searching the static graph
    at its first call would be wasted; a graph called again with the same sizes is searched
    then. With ``dynamic=False``, with symbolic sizes, or with ``warmup=0`` a graph is
    searched when Dynamo compiles it.
    """

    def __init__(self, target: str = "h100", time_limit_s: float | str = AUTO, min_ops: int = 2,
                 warn: bool = True, warmup: int | None = None, size_hint: int | None = None,
                 size_max: int | None = None, cuda_graph: Any = True,
                 **optimize_options: Any) -> None:
        check_options(dict(target=target, time_limit_s=time_limit_s, min_ops=min_ops, warn=warn,
                           warmup=warmup, size_hint=size_hint, size_max=size_max,
                           cuda_graph=cuda_graph, **optimize_options))  # not in torch.compile
        self.options = dict(target=target, time_limit_s=time_limit_s, **optimize_options)
        self.min_ops, self.warn, self.warmup = min_ops, warn, warmup
        self.size_hint, self.size_max = size_hint, size_max
        self.cuda_graph = cuda_graph
        self.report: list[PartitionReport] = []
        self.unsupported: list[str] = []
        self._records: list[GraphRecord] = []
        self._graphs = 0
        self.warming: set[int] = set()  # graphs in their warmup calls (``Warmup``)
        self._limits: dict[int, float | None] = {}  # graph number -> its time limit (s)
        self._folded: dict[int, Folded] = {}  # graph number -> the ops computed at compile
        self.experts: dict = {}  # em.use_experts: its compiled expert MLPs, by form

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``(gm, example_inputs)``: compile (Dynamo's call); keywords only: a new Backend."""
        if len(args) == 2 and isinstance(args[0], fx.GraphModule) and not kwargs:
            return self.compile(args[0], list(args[1]))
        if args:
            raise MirageError("em.backend takes (graph_module, example_inputs) from torch."
                              "compile, or keyword options only, e.g. em.backend(target="
                              f"'h100', time_limit_s=2); got {len(args)} positional argument(s)")
        opts = {**self.options, "min_ops": self.min_ops, "warn": self.warn,
                "warmup": self.warmup, "size_hint": self.size_hint,
                "size_max": self.size_max, "cuda_graph": self.cuda_graph, **kwargs}
        return Backend(**opts)

    def __repr__(self) -> str:
        return f"Backend({', '.join(f'{k}={v!r}' for k, v in self.options.items())})"

    def warning(self, text: str, prefix: str = "eqsat-mirage backend: ") -> None:
        """Warn ``prefix + text`` (pointing at the caller's caller), unless ``warn=False``."""
        if self.warn:
            warnings.warn(f"{prefix}{text}", stacklevel=3)

    def compile(self, gm: fx.GraphModule, example_inputs: list) -> Any:
        """Partition ``gm``, optimize each partition, return the callable graph module."""
        self._graphs += 1
        if torch.is_grad_enabled() and any(getattr(x, "requires_grad", False)
                                           for x in example_inputs):
            return self.refuse(gm, self._graphs, "inputs require grad and the optimized kernels "
                               "have no backward: the graph runs eagerly (use torch.no_grad() "
                               "or torch.inference_mode())")
        refused = functionalize(gm, example_inputs, lambda n: op_name(n, gm) + (
            f" at {source_line(n)}" if source_line(n) else ""))  # writes into fresh tensors
        mutating, why = refused if refused is not None else (mutation(gm), "")
        if mutating is not None:  # partitions could move reads across the write: stay eager
            loc = source_line(mutating)
            return self.refuse(gm, self._graphs, f"the graph mutates a tensor in place "
                               f"({op_name(mutating, gm)}" + (f" at {loc}" if loc else "")
                               + (f"; {why}" if why else "") + "): it runs eagerly")
        self._ensure_specs(gm, example_inputs)
        self._folded[self._graphs] = fold_constants(gm)  # position math: computed once now
        retarget_tensor_indexing(gm)  # w[i]: torch.fx's partitioner loops on it otherwise
        gm.meta[CONSTANTS] = buffer_constants(gm, example_inputs)
        try:
            sizes = SymbolicSizes(gm, self.size_hint, self.size_max)
        except Exception as exc:  # noqa: BLE001 - Dynamo's shape environment changed shape
            if unexpected(exc):
                raise
            return self.refuse(gm, self._graphs, f"reading the graph's symbolic sizes failed "
                               f"({type(exc).__name__}: {exc}): the graph runs eagerly")
        symbolic_view_sizes(gm, sizes.family | set(sizes.specialized))  # expand(.., s + 1): -1
        calls = self._warmup_calls()
        if calls and not sizes.dynamic:
            return Warmup(self, gm, sizes, self._graphs, calls)
        return self.build(gm, sizes, self._graphs)

    def refuse(self, gm: fx.GraphModule, number: int, why: str) -> Any:
        """Graph ``number`` (``gm``) runs eagerly as a whole because ``why``: warn, record
        it in ``summary()`` (outcome "eager", every op counted) and in ``report`` (one
        ``PartitionReport`` named ``graph_<number>``, status "eager"); returns ``gm.forward``."""
        self.warning(why)
        calls = [n for n in gm.graph.nodes if n.op.startswith("call")]
        self.report.append(PartitionReport(f"graph_{number}", [op_name(n, gm) for n in calls],
                                           status="eager", reason=why))
        self._records.append(GraphRecord(number, len(calls), sum(map(computes, calls)), [], [],
                                         refused=why))
        return gm.forward

    def _warmup_calls(self) -> int:
        """Eager calls before a static graph is searched (``warmup``; None: 1 while Dynamo's
        automatic dynamic shapes are on)."""
        if self.warmup is not None:
            return self.warmup
        try:
            from torch._dynamo import config
            from torch._guards import TracingContext
        except ImportError:  # pragma: no cover - a torch without Dynamo
            return 0
        inside = TracingContext.try_get() is not None  # a graph Dynamo compiles (may replace)
        return int(inside and bool(getattr(config, "automatic_dynamic_shapes", False)))

    def build(self, gm: fx.GraphModule, sizes: SymbolicSizes, number: int) -> Any:
        """Partition graph ``number`` (``gm``), optimize each partition, return its callable.
        The partitions share ``time_limit_s`` (``limits.Shares``, weighted by their expected
        search cost, ``NodeSupport.weight``): the whole call holds the limit, not each
        partition, and time one leaves unused goes to those after it."""
        start = time.perf_counter()
        support = NodeSupport(gm, sizes)
        part = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True)
        try:
            parts = part.propose_partitions()
            if sizes.family:  # the ops touching the symbolic size: families of their own
                parts = split_runs(parts, gm, sizes.touches)
            small = [p for p in parts if not self._worth(p, sizes)]
            parts = [p for p in parts if self._worth(p, sizes)]
        except Exception as exc:  # noqa: BLE001 - the partitioner failed: the graph runs eagerly
            if unexpected(exc):
                raise
            return self.refuse(gm, number, f"partitioning failed ({type(exc).__name__}: "
                               f"{exc}): the graph runs eagerly")
        eager = []
        for node in gm.graph.nodes:
            if node.op.startswith("call") and not node.users and not node.all_input_nodes \
                    and recorded(node) is None:  # Python glue of no tensor that returns
                continue  # nothing (torch._C._log_api_usage_once): not work left eager
            if node.op.startswith("call") and support.reason(node) is not None:
                name, loc, why = op_name(node, gm), source_line(node), support.reason(node)
                self.unsupported.append(name + (f" at {loc}" if loc else "") + f": {why}")
                short = loc.split(" (`")[0]  # file:line, without the code
                eager.append(name + (f" at {short}" if short else "") + f" ({why})")
        eager += [f"{op_name(n, gm)} (a partition of {len(p.nodes)} op(s), below min_ops="
                  f"{self.min_ops})" for p in small for n in p.nodes if n.op.startswith("call")]
        eager += left_out(gm, support, [n for p in parts + small for n in p.nodes])
        total = sum(n.op.startswith("call") for n in gm.graph.nodes)
        total = (total, sum(computes(n) for n in gm.graph.nodes))
        if not parts:
            self._summarize(total, [], eager, sizes, number,
                            [op_name(n, gm) for n in gm.graph.nodes if n.op.startswith("call")])
            return gm.forward
        limit = resolve_time_limit(self.options.get("time_limit_s"),  # before fusing
                                   graph_work([n for q in parts for n in q.nodes]),
                                   AUTO_BASE_S, blas.gflops)
        self._limits[number] = limit
        prefix = f"{_PREFIX}{number}_"
        fused = part.fuse_partitions(parts, prefix=prefix)
        support.fold_all(fused)  # the nodes fusing made: which partition inputs are constant
        entries = []
        nodes = [node for node in fused.graph.nodes if node.op == "call_module"
                 and str(node.target).startswith(prefix)]
        subs = [fused.get_submodule(node.target) for node in nodes]
        weights = [max(1.0, sum(map(support.weight, parts[int(str(node.target)[len(prefix):])]
                                    .nodes))) for node in nodes]  # fused: prefix + index
        shares = Shares(limit, weights, start)
        for i, (node, sub) in enumerate(zip(nodes, subs)):
            places = [n for n in sub.graph.nodes if n.op == "placeholder"]
            known = [support.known(a) if isinstance(a, fx.Node) else None
                     for a in node.args]  # buffers, and what is computed from them
            sub.meta[CONSTANTS] = {p: v for p, v in zip(places, known) if v is not None
                                   and len(places) == len(node.args)}
            share = shares.share(i)
            replacement = self._partition(str(node.target), sub, sizes, time_limit_s=share)
            entries.append(self.report[-1])
            entries[-1].share_s, entries[-1].weight = share, weights[i]
            if replacement is not None:
                setattr(fused, node.target, replacement)
        fused.recompile()
        self._summarize(total, entries, eager, sizes, number)
        replayed = [e.module for e in entries if e.status == "optimized" and e.module.graphs]
        return CopyEscaping(fused.forward, replayed) if replayed else fused.forward

    def _worth(self, part, sizes: SymbolicSizes) -> bool:
        """Whether a proposed partition is optimized: ``min_ops`` ops or more, or one op that
        is a whole computation of its own (an SDPA; an op reading a quantized weight, which
        it dequantizes); the same rule for static graphs and shape families (a lone
        ``silu`` is below ``min_ops=2`` in both)."""
        nodes = list(part.nodes)
        return len(nodes) >= self.min_ops or any(
            n.target in _COMPOSITE or str(n.target).endswith("scaled_dot_product_attention")
            or any(is_wrapped(recorded(a)) for a in n.all_input_nodes) for n in nodes)

    def _summarize(self, total: tuple[int, int], entries: list[PartitionReport],
                   eager: list[str], sizes: SymbolicSizes, number: int,
                   ops: list[str] | None = None) -> None:
        """Record this graph (``report.GraphRecord``) and warn once with its summary (unless
        ``warn=False``); ``total``: the graph's call ops, and those of them that compute;
        ``ops``: their names, for the graph's entry in ``report`` when nothing was searched."""
        record = GraphRecord(number, total[0], total[1], entries, eager,
                             sizes.describe() if sizes.dynamic else "static",
                             self._limits.get(number),
                             folded=self._folded.get(number, Folded()).ops)
        self._records.append(record)
        if not entries:  # nothing searched: the graph's entry in ``report`` says why
            self.report.append(PartitionReport(f"graph_{number}", ops or [], status="eager",
                                               reason=record.outcome()[1]))
        self.warning(record.warning(), prefix="eqsat-mirage: ")

    def summary(self) -> dict:
        """What ran optimized and what stayed eager and why, over every graph compiled so far (read
        from the reports now: a partition that fell back at its first call is eager): the
        totals (``ops``: call nodes; ``compute_ops``: those computing a non-empty float
        tensor; ``optimized_compute_ops``: those of them in optimized pieces, the coverage's
        numerator; ``time_limited_compute_ops``: those left as they were only because the
        time limit cut their search short; ``predicted_us``: before and after, over the
        graphs priced), ``graphs``, one dict per graph (``GraphRecord.summary``: its
        ``outcome``, "optimized", "partly optimized" or "eager", and ``reason``; a graph
        that ran eagerly as a whole is there with its ops), and ``eager_only``: the graphs
        not searched, which so far ran only their ``warmup`` calls (a static graph Dynamo
        replaced after one call stays there; its ops are not in the totals); ``launches``:
        how each optimized partition launched so far, in words; ``cuda_graphs``: the
        partitions replayed as CUDA graphs; ``eager_calls``: the optimized partitions some
        of whose calls ran eagerly (sizes or values the program does not serve), how many
        and why."""
        graphs = [r.summary() for r in sorted(self._records, key=lambda r: r.number)]
        priced = [g["predicted_us"] for g in graphs if g["predicted_us"]]
        return {"ops": sum(g["ops"] for g in graphs),
                "compute_ops": sum(g["compute_ops"] for g in graphs),
                "optimized_ops": sum(g["optimized_ops"] for g in graphs),
                "optimized_compute_ops": sum(g["optimized_compute_ops"] for g in graphs),
                "optimized_partitions": sum(g["optimized_partitions"] for g in graphs),
                "time_limited_compute_ops": sum(g["time_limited_compute_ops"] for g in graphs),
                "predicted_us": [sum(p[0] for p in priced), sum(p[1] for p in priced)]
                if priced else None,
                "folded_ops": sum(len(g["folded"]) for g in graphs),
                "eager": [e for g in graphs for e in g["eager"]], "graphs": graphs,
                "eager_only": sorted(self.warming), **launch_summary(self.report)}

    def _ensure_specs(self, gm: fx.GraphModule, example_inputs: list) -> None:
        """Run ShapeProp when some node lacks Dynamo's example value (a plain fx graph)."""
        keys = ("example_value", "val", "tensor_meta")
        if all(n.op == "output" or any(k in n.meta for k in keys) for n in gm.graph.nodes):
            return
        try:
            from torch.fx.passes.shape_prop import ShapeProp

            ShapeProp(gm).propagate(*example_inputs)
        except Exception:  # noqa: BLE001 - unknown shapes just make nodes unsupported
            pass

    def _partition(self, name: str, sub: fx.GraphModule, sizes: SymbolicSizes,
                   report: bool = True, entry: PartitionReport | None = None,
                   time_limit_s: float | None = None) -> OptimizedPartition | None:
        """Convert, optimize and (where it will run on Triton) compile one partition, in
        ``time_limit_s`` seconds (default: the backend's whole ``time_limit_s``).

        With sizes Dynamo left symbolic but this program specialized, the module may search
        once more, with the size a call moved as the family size (``OptimizedPartition._adopt``),
        in the same ``time_limit_s`` (each partition of the graph may search again in one
        call: their shares keep that call within the graph's limit, and the family's size
        checks within as much again).
        """
        ops = [op_name(n, sub) for n in sub.graph.nodes if n.op.startswith("call")]
        entry = entry or PartitionReport(name, ops)
        if report:
            self.report.append(entry)
        t0 = time.perf_counter()
        try:
            graph, cv, outs, single, device = self._convert(name, sub, sizes)
            entry.graph = graph
            if not graph.outputs:
                entry.status, entry.reason = "eager", "no computation (identity ops only)"
                return None
            options = dict(self.options)
            if time_limit_s is not None:
                options["time_limit_s"] = time_limit_s
            options.setdefault("launch", launch_mode(graph, self.cuda_graph))
            entry.result = optimize(graph, **options)
            if not improved(entry.result):  # nothing better found: the eager ops stay
                entry.status, entry.reason = "unchanged", unchanged_reason(entry.result)
                entry.time_limited_compute_ops = time_limited_ops(sub, cv, entry.result, True)
                entry.seconds = time.perf_counter() - t0
                return None
            mod = OptimizedPartition(sub, entry, dict(cv.sources), outs, single)
            mod.graphs, entry.module = graphs_backend(self.cuda_graph), mod
            mod.scalars = cv.scalars
            mod.guards = {ref: snap for (kind, ref), snap in cv.snapshots.items()
                          if kind == "arg"}
            places = [n for n in sub.graph.nodes if n.op == "placeholder"]
            mod.held = {ident: sizes.held(places[ref]) for ident, (kind, ref)
                        in cv.sources.items() if kind == "arg"}
            if report and any(mod.held.values()):
                def replan(symbols, name=name, sub=sub, sizes=sizes, limit=time_limit_s):
                    again = PartitionReport(name, ops, share_s=limit)  # this one's share
                    return self._partition(name, sub, sizes.focus(symbols), False, again,
                                           limit), again.reason
                mod.replan = replan
            if device is not None and uses_triton(device):
                mod.runner(device)  # compile now: codegen errors fall back here
        except Exception as exc:  # noqa: BLE001 - MirageError, Triton errors, ...: run eagerly
            if unexpected(exc):
                raise
            entry.status, entry.reason = "fallback", f"{type(exc).__name__}: {exc}"
            entry.seconds = time.perf_counter() - t0
            return None
        entry.status, entry.seconds = "optimized", time.perf_counter() - t0
        entry.optimized_ops, entry.optimized_compute_ops = optimized_ops(sub, cv, entry.result)
        entry.time_limited_compute_ops = time_limited_ops(sub, cv, entry.result, False)
        return mod

    def _convert(self, name: str, sub: fx.GraphModule, sizes: SymbolicSizes) -> tuple:
        """The em.Graph of a fused partition, its Converter, outputs and device."""
        cv = Converter(Graph(name), sub)
        cv.scalars = {}  # placeholder position -> the float it is held at (checked per call)
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        consts = sub.meta.get(CONSTANTS, {})  # buffers: comparisons of them are folded
        specs = {n: sizes.spec(n) for n in placeholders}
        dims = sizes.dims([d for spec in specs.values() if spec for d in spec[0]])
        device = None
        outs: list[tuple[str, str | None]] = []
        single = True
        for node in sub.graph.nodes:
            if node.op == "placeholder":
                spec, scalar = specs[node], sizes.scalar(node)
                if spec is None and scalar is not None:
                    cv.env[node] = cv.scalars[placeholders.index(node)] = scalar
                    continue
                if spec is None:
                    raise MirageError(f"input {node.name!r} is not a float tensor")
                if 0 in spec[0]:  # an empty slice made by another partition: dropped by a cat
                    cv.env[node] = Empty(tuple(spec[0]), spec[1])
                    continue
                device = device or spec[2]
                cv.env[node] = constant_input(cv, node, node.name, served(spec[0], dims),
                                              spec[1], ("arg", placeholders.index(node)),
                                              consts.get(node))
            elif node.op == "output":
                value = fx.node.map_arg(node.args[0], cv.env.__getitem__)
                single = not isinstance(value, (tuple, list))
                for out_name, t in cv.outputs(value):
                    if isinstance(t, Empty):
                        raise MirageError(f"output {out_name!r} is a zero-size tensor")
                    if isinstance(t, BoolMask):
                        raise MirageError(f"output {out_name!r} is a bool mask folded from "
                                          "constants, read outside the partition")
                    if not isinstance(t, Tensor):
                        raise MirageError(f"output {out_name!r} is a constant "
                                          f"{type(t).__name__}, read outside the partition")
                    if t.node.op.name == "INPUT":  # an identity: hand the input back
                        outs.append((out_name, t.node.arg))
                    else:
                        ident = unique_identifier(out_name, cv.used)
                        cv.graph.output(t, ident)
                        outs.append((ident, None))
            else:
                cv.run(node)
        cv.finish(frozenset(src for _, src in outs if src))  # an identity output's input
        return cv.graph, cv, outs, single, device


backend = Backend()
