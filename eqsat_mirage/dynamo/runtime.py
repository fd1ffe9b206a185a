"""The module that runs one optimized partition in place of its eager fx submodule.

It feeds the partition's inputs (graph arguments and the root's parameters) to the
optimized program: Triton (``res.compile()``) on CUDA tensors and under
``TRITON_INTERPRET=1``, else a torch implementation of the chosen program. A shape
family (a partition with a size Dynamo left symbolic) reads the size from its inputs.
Each call checks the static sizes first; a call the program does not serve runs
eagerly, with one warning. ``Warmup`` stands for a static graph during its warmup calls
(the backend's ``warmup``): eager, then searched at the call after them. The first call
with each input signature is checked against the partition's input program run by torch
(``runtime.check``); a mismatch runs the partition eagerly from then on, with a
warning naming the output, the kernel and the worst element. On CUDA inputs a static
partition's launches are replayed as a CUDA graph (``replay``; the backend's
``cuda_graph``), captured after that check.
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import Any

import torch
from torch import fx

from ..family.runner import FamilyRunner
from ..frontend.torch_masks import source_value
from ..ir.dims import DynamicShapeError
from ..ir.errors import unexpected
from ..runtime.check import LaunchCheckError
from ..semantics.gather import IndexRangeError
from ..semantics.torch_reference import checked_against, torch_reference
from .replay import Replay

__all__ = ["OptimizedPartition", "uses_triton"]


def _fetch(root: torch.nn.Module, path: str) -> Any:
    obj = root
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def uses_triton(device: torch.device) -> bool:
    """Whether a partition on ``device`` runs as Triton (CUDA, or the CPU interpreter)."""
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


class OptimizedPartition(torch.nn.Module):
    """Runs one partition's optimized program in place of its eager submodule.

    Each call checks the inputs' static sizes (a size Dynamo left symbolic but the
    partition specialized may differ) and runs that call eagerly when the program does
    not serve them; a shape family reads its size from the inputs."""

    def __init__(self, eager: fx.GraphModule, entry: Any, sources: dict,
                 outs: list[tuple[str, str | None]], single: bool) -> None:
        super().__init__()
        self.eager, self.entry, self.sources = eager, entry, sources
        self.outs, self.single = outs, single
        self.failed = False
        self._fns: dict[str, Any] = {}
        self.expect = {n: node.shape for n, node in entry.graph.inputs.items()}
        # input -> {axis: (specialized symbol, offset)}: the axis is the symbol + offset
        self.held: dict[str, dict[int, tuple[Any, int]]] = {}
        self.replan: Any = None  # symbols -> an OptimizedPartition with them as the family, once
        self.scalars: dict[int, float] = {}  # argument position -> the float it is held at
        self.guards: dict[int, Any] = {}  # argument position -> the buffer Snapshot folded
        self.graphs: Any = None  # the graphs backend replaying its launches (None: plain)

    def _moved(self, feed: dict) -> set:
        """The held symbols this call moved, when they all moved to one value (a KV
        cache's keys and values grow together), else the empty set (two sizes moved apart:
        no search can serve the call, and the one search again is kept for later)."""
        now: dict[Any, set] = {}
        for n, t in feed.items():
            for a, (sym, offset) in self.held.get(n, {}).items():
                if a < t.dim():
                    now.setdefault(sym, set()).add(int(t.shape[a]) - offset)
        first = {sym: self.expect[n][a] - offset for n in self.held
                 for a, (sym, offset) in self.held[n].items()}
        moved = {sym for sym, vals in now.items() if vals != {first[sym]}}
        values = set().union(*(now[sym] for sym in moved)) if moved else set()
        return moved if len(values) == 1 else set()

    def _adopt(self, symbols: frozenset, feed: dict) -> bool:
        """A call moved specialized sizes ``symbols`` to one value: search again with them
        as the family size (once per partition) and adopt that program if it serves
        ``feed`` (it holds the other sizes at their first values). Returns whether the
        program now serves ``feed``."""
        replan, self.replan = self.replan, None
        symbol = ", ".join(sorted(map(str, symbols)))
        new, reason = replan(symbols)
        if new is None:
            self.entry.replan = f"searching with {symbol} symbolic failed: {reason}"
            warnings.warn(f"eqsat-mirage backend: partition {self.entry.name}: a call moved "
                          f"size {symbol}, and searching with it symbolic failed ({reason})",
                          stacklevel=3)
            return False
        why = new.unserved(feed)
        if why:
            self.entry.replan = f"the search with {symbol} symbolic does not serve it ({why})"
            return False
        keep = {k: getattr(self.entry, k) for k in ("calls", "eager_calls", "eager_why",
                                                     "module", "weight")}
        keep["seconds"] = self.entry.seconds + new.entry.seconds
        self.entry.__dict__.update(new.entry.__dict__, **keep, replan=f"symbolic {symbol}")
        for key in ("sources", "outs", "single", "expect", "held", "guards", "graphs"):
            setattr(self, key, getattr(new, key))
        self._fns = new._fns
        return True

    def runner(self, device: torch.device) -> tuple[str, Any]:
        """``(mode, fn)``: the callable running this partition's program on ``device``
        ("triton": ``res.compile()``, or a shape family's ``FamilyRunner``; "torch": its
        torch implementation), built at the first call for its mode and kept. Both check
        their first launch per input signature; with a graphs backend (``graphs``) a static
        program on Triton is replayed as a CUDA graph (``replay.Replay``)."""
        triton = uses_triton(device)
        key = "triton" if triton else "torch"
        if key not in self._fns:
            res = self.entry.result
            if getattr(res, "scaling", None) is not None:  # a shape family
                self._fns[key] = FamilyRunner(res.family, res.scaling, engine=key)
            else:
                # both check their first launch per input signature against the input
                # program run by torch (runtime.check)
                self._fns[key] = res.compile() if triton else checked_against(
                    torch_reference(res.program), res.reference(),
                    mugraph=res.program if hasattr(res.program, "kernels") else None)
                if triton and self.graphs is not None:
                    fixed = [n for n, (kind, _) in self.sources.items()
                             if kind in ("param", "const", "inner")]  # inner: a weight's parts
                    self._fns[key] = Replay(self._fns[key], fixed, self.graphs, self.entry.name)
        return key, self._fns[key]

    def buffers(self) -> set[int]:
        """The storage addresses of the static buffers its CUDA graphs hold (none when it
        launches plainly): a compiled graph's results sharing them are copied."""
        fn = self._fns.get("triton")
        return fn.buffers() if isinstance(fn, Replay) else set()

    def launches(self) -> str:
        """How its optimized program launched so far, in words (``be.summary()``)."""
        fn = self._fns.get(self.entry.mode or "triton")
        if isinstance(fn, Replay):
            return fn.how()
        if not self.entry.calls:
            return "not run yet"
        if self.entry.mode == "torch":
            return "torch code (no Triton on this device)"
        if getattr(self.entry.result, "scaling", None) is not None:
            return "plain launches: a shape family (its sizes vary per call)"
        return "plain launches" + (": cuda_graph=False" if self.graphs is None else "")

    def unserved(self, feed: dict) -> str:
        """Why the program does not serve these inputs (a static size differs), or ""."""
        for name, t in feed.items():
            want, dyn = self.expect[name], self.entry.graph.dynamic.get(name, {})
            if t.dim() != len(want) or any(a not in dyn and t.shape[a] != w
                                           for a, w in enumerate(want)):
                served = ", ".join(dyn[a] if a in dyn else str(w) for a, w in enumerate(want))
                return f"input {name!r} has shape {list(t.shape)}; the program serves [{served}]"
        return ""

    def _eager_call(self, why: str, args: tuple) -> Any:
        self.entry.eager_calls += 1
        if self.entry.eager_calls == 1:
            self.entry.eager_why = why
            warnings.warn(f"eqsat-mirage backend: partition {self.entry.name} runs eagerly "
                          f"for calls it does not serve: {why}", stacklevel=3)
        return self.eager(*args)

    def forward(self, *args: Any) -> Any:
        def fetch(kind: str, ref: Any) -> Any:
            return args[ref] if kind == "arg" else _fetch(self.eager, ref)

        feed = {name: source_value(src, fetch) for name, src in self.sources.items()}
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in feed.values())
        if self.failed or grad:
            return self.eager(*args)
        why = next((f"argument {i} is {float(args[i])!r}; the program holds it at {v!r}"
                    for i, v in self.scalars.items() if float(args[i]) != v), "")
        if why:
            return self._eager_call(why, args)
        why = next((f"argument {i} (a buffer folded into a mask) no longer holds the value "
                    "it was folded at"
                    for i, snap in self.guards.items() if not snap.holds(args[i])), "")
        if why:
            return self._eager_call(why, args)
        why = self.unserved(feed)
        if why and self.replan is not None:
            moved = self._moved(feed)
            if moved and self._adopt(frozenset(moved), feed):
                why = ""
        if why:
            return self._eager_call(why, args)
        try:
            device = next(iter(feed.values())).device
            mode, fn = self.runner(device)
            got = fn(**{n: t.contiguous() for n, t in feed.items()})
        except DynamicShapeError as exc:  # sizes that should agree do not, or out of range
            return self._eager_call(str(exc), args)
        except (IndexRangeError, IndexError) as exc:  # an index past a gather's table (the
            # torch reference's check, or torch.index_select's in the generated module): this
            # call runs eagerly, where torch raises it; the next call may be valid
            return self._eager_call(f"{type(exc).__name__}: {exc}", args)
        except LaunchCheckError as exc:  # the code that ran disagrees with the input program
            self.failed = True
            self.entry.status = "fallback"
            self.entry.reason = f"the checked first launch failed: {exc}"
            warnings.warn(f"eqsat-mirage backend: partition {self.entry.name} runs eagerly: "
                          f"{self.entry.reason}", stacklevel=2)
            return self.eager(*args)
        except Exception as exc:  # noqa: BLE001 - e.g. a Triton compilation error
            if unexpected(exc):
                raise
            self.failed = True
            self.entry.status, self.entry.reason = "fallback", f"{type(exc).__name__}: {exc}"
            warnings.warn(f"eqsat-mirage backend: partition {self.entry.name} runs eagerly: "
                          f"running the optimized program failed: {self.entry.reason}",
                          stacklevel=2)
            return self.eager(*args)
        self.entry.mode, self.entry.calls = mode, self.entry.calls + 1
        vals = [got[name] if src is None else feed[src] for name, src in self.outs]
        return vals[0] if self.single else tuple(vals)


class Warmup:
    """A static graph's callable while it warms up (``Backend``'s ``warmup``): its first
    ``calls`` calls run eagerly, the next one searches it (``be.build``: partitions,
    searches, the summary) and runs it, and so does every later one.
    A search that fails leaves the graph eager, with a warning, and says so in the
    backend's summary (``be.refuse``)."""

    def __init__(self, be, gm, sizes, number: int, calls: int) -> None:
        self.be, self.gm, self.sizes, self.number, self.left = be, gm, sizes, number, calls
        self.run = None
        self.lock = threading.Lock()
        be.warming.add(number)

    def __call__(self, *args: Any) -> Any:
        if self.run is None:
            with self.lock:
                if self.run is None and self.left > 0:
                    out = self.gm.forward(*args)
                    self.left -= 1
                    return out
                if self.run is None:
                    self.run = self._build()
        return self.run(*args)

    def _build(self) -> Any:
        be, gm = self.be, self.gm
        be.warming.discard(self.number)
        try:
            run = be.build(gm, self.sizes, self.number)
        except Exception as exc:  # noqa: BLE001 - the graph stays eager, as at compile time
            if unexpected(exc):
                raise
            run = be.refuse(gm, self.number, f"optimizing graph {self.number} failed "
                            f"({type(exc).__name__}: {exc}): it runs eagerly")
        self.gm = self.sizes = None  # held by the built graph where still needed
        return run
