"""CUDA-graph replay of the backend's static partitions (``em.backend(cuda_graph=True)``).

On CUDA inputs a static partition's compiled program (``res.compile()``, its first launch
checked) runs through ``runtime.graphs.GraphRunner``: the first call with each input
signature runs it plainly (the checked first launch: a mismatch raises
``LaunchCheckError`` before anything is captured), captures one call into a CUDA graph,
and every later call copies the inputs into the graph's static buffers and replays it: one
launch from the host instead of one per kernel, as ``torch.compile(mode="reduce-overhead")``
does.

- **Inputs.** Inputs that keep their memory from call to call are not copied: the graph
  reads them in place. Those are the module's parameters (an ``nn.Parameter``, contiguous)
  and the partition's constants and module attributes (sources ``"param"``, ``"const"``),
  and the tensors a quantized weight holds (source ``"inner"``).
  The graph is captured per binding of those (their addresses, shapes, strides, dtypes);
  a call whose parameter moved (``model.to(...)``, a new ``Parameter`` assigned) captures
  again; at most ``BINDINGS`` bindings are kept (the oldest is dropped). Every other input (the
  activations) is copied into a static buffer at each call.
- **Signatures.** One graph per input signature (shape, dtype, device and strides of the
  copied inputs), at most ``MAX_GRAPHS`` per binding; calls with further signatures
  launch plainly. A static partition serves one shape, so it holds one graph.
- **Outputs.** A graph's outputs are its static buffers, overwritten when the partition
  runs again. Inside one call of the compiled graph they feed the ops after them and are
  dead before the next call, so they are not copied; what the compiled graph returns is
  checked (``copy_escaping``): an output sharing memory with a static buffer is copied
  (its storage, once, so views keep their strides and their aliasing of each other).
  What the caller gets is never overwritten by a later call.
- **Not captured.** A shape family (its sizes vary per call), a partition that runs as
  torch code (CPU), a partition that fell back to eager, inputs not on a CUDA device, a
  call made while the caller captures a CUDA graph of its own (the kernels join that
  graph), and ``cuda_graph=False`` launch plainly. A capture that fails (an op that cannot be
  captured) leaves the partition launching plainly, with a warning; the reason is in
  ``be.summary()["launches"]``.

Calls from several threads at once are not supported (the static buffers are shared), as
with torch's CUDA graphs. The capture and replay go through a graphs backend object
(``runtime.graphs.CudaGraphs``, or one given as ``em.backend(cuda_graph=obj)``), so the
bookkeeping is tested on a CPU with a fake one.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..runtime.check import LaunchCheckError
from ..runtime.graphs import GraphRunner

__all__ = ["BINDINGS", "MAX_GRAPHS", "CopyEscaping", "Replay", "copy_escaping", "graphs_backend"]

BINDINGS = 4  # bindings of the in-place inputs (parameters) kept per partition
MAX_GRAPHS = 8  # graphs kept per binding, one per input signature


def graphs_backend(value: Any) -> Any:
    """The graphs backend object of the ``cuda_graph`` option: ``True`` -> torch's
    (``CudaGraphs``), ``False`` -> None, an object with ``available``, ``capture`` and
    ``replay`` -> itself."""
    if value is True:
        from ..runtime.graphs import CudaGraphs

        return CudaGraphs()
    return value or None


def _capturing(tensors: list) -> bool:
    """Whether the caller is capturing a CUDA graph of its own (the kernels join it)."""
    return bool(tensors) and getattr(tensors[0], "is_cuda", False) and \
        torch.cuda.is_current_stream_capturing()


def _bound(run: Callable, free: list[str], held: dict) -> Callable:
    def call(*tensors):
        return run(**dict(zip(free, tensors)), **held)
    return call


class Replay:
    """A static partition's program (``run``, taking its inputs by name), replayed as a
    CUDA graph on CUDA inputs (module docstring). ``fixed``: the inputs that are constants
    of the partition (read in place like parameters); ``graphs``: the graphs backend.

    ``how()`` says in words how it launched so far; ``buffers()``: the addresses of the
    storages its graphs hold (static inputs and outputs), which escaping outputs are
    copied from."""

    def __init__(self, run: Callable, fixed: Iterable[str], graphs: Any, name: str = "") -> None:
        self.run, self.fixed, self.graphs, self.name = run, frozenset(fixed), graphs, name
        self.runners: dict[tuple, tuple[list[str], GraphRunner]] = {}  # binding -> runner
        self.plain = 0  # calls launched plainly (not CUDA inputs, or capture failed)
        self.broken = ""  # why capture failed: every later call launches plainly
        self._buffers: set[int] = set()
        self._seen = 0  # captures when _buffers was computed

    def _held(self, feed: dict) -> dict:
        return {n: t for n, t in feed.items()
                if (n in self.fixed or isinstance(t, torch.nn.Parameter)) and t.is_contiguous()}

    def __call__(self, **feed: Any) -> Any:
        """The program's outputs for ``feed`` (replayed: the graph's static buffers)."""
        tensors = list(feed.values())
        if self.broken or not self.graphs.available(tensors) or _capturing(tensors):
            self.plain += 1
            return self.run(**feed)
        held = self._held(feed)
        key = tuple((n, t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device)
                    for n, t in held.items())
        found = self.runners.get(key)
        if found is None:
            if len(self.runners) >= BINDINGS:
                self.runners.pop(next(iter(self.runners)))
            free = [n for n in feed if n not in held]
            found = self.runners[key] = (free, GraphRunner(_bound(self.run, free, held), free,
                                                           backend=self.graphs,
                                                           max_graphs=MAX_GRAPHS))
        free, runner = found
        try:
            return runner(*[feed[n] for n in free])
        except LaunchCheckError:
            raise
        except Exception as exc:  # noqa: BLE001 - the capture failed, or the program did
            out = self.run(**feed)  # a program that fails plainly too raises here
            self.runners.pop(key, None)
            self.broken = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"eqsat-mirage backend: partition {self.name}: capturing a CUDA graph "
                          f"failed ({self.broken}): it launches plainly", stacklevel=3)
            self.plain += 1
            return out

    def counts(self) -> tuple[int, int]:
        """(graphs captured, replays) over every binding kept."""
        runners = [r for _, r in self.runners.values()]
        return sum(r.captures for r in runners), sum(r.replays for r in runners)

    def buffers(self) -> set[int]:
        """The storage addresses of every static input and output the graphs hold."""
        captures = self.counts()[0]
        if captures != self._seen:
            self._seen = captures
            self._buffers = {t.untyped_storage().data_ptr()
                             for _, r in self.runners.values()
                             for _, static, outs in r.graphs.values()
                             for t in [*static, *outs.values()] if isinstance(t, torch.Tensor)}
        return self._buffers

    def how(self) -> str:
        """How this partition's launches ran, in words."""
        captures, replays = self.counts()
        if self.broken:
            return f"plain launches: capturing a CUDA graph failed ({self.broken})"
        if captures:
            return (f"CUDA graph: {captures} captured, {replays} replays"
                    + (f", {self.plain} plain launches" if self.plain else ""))
        if self.plain:
            return "plain launches: inputs not on a CUDA device"
        return "not run yet"


def copy_escaping(out: Any, buffers: set[int]) -> Any:
    """``out`` (a compiled graph's result: a tensor, or tuples and lists of them) with every
    tensor that shares memory with a static buffer (``buffers``: storage addresses) moved to
    a copy of its storage, made once per storage: views keep their strides and offsets and
    still alias each other."""
    copies: dict[int, Any] = {}

    def fix(value: Any) -> Any:
        if isinstance(value, (tuple, list)):
            return type(value)(fix(v) for v in value)
        if not isinstance(value, torch.Tensor) or value.numel() == 0:
            return value
        storage = value.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in buffers:
            return value
        if ptr not in copies:
            copies[ptr] = storage.clone()
        fresh = torch.empty(0, dtype=value.dtype, device=value.device)
        return fresh.set_(copies[ptr], value.storage_offset(), value.size(), value.stride())

    with torch.no_grad():
        return fix(out)


class CopyEscaping:
    """A compiled graph's forward whose results sharing memory with a replayed partition's
    static buffers are copied (``copy_escaping``); ``parts``: the graph's
    ``OptimizedPartition`` modules (each with ``buffers()``)."""

    def __init__(self, forward: Callable, parts: list) -> None:
        self.forward, self.parts = forward, parts

    def __call__(self, *args: Any) -> Any:
        out = self.forward(*args)
        buffers: set[int] = set()
        for part in self.parts:
            buffers |= part.buffers()
        return copy_escaping(out, buffers) if buffers else out
