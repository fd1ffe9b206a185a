"""CUDA-graph replay of a compiled program: ``res.compile(cuda_graph=True)``.

A ``GraphRunner`` wraps the launcher ``run`` of a generated module. The first
call with a new input signature (shape, dtype, device and strides of every
input) copies the inputs into static buffers, runs ``run`` once to warm up
(Triton compiles there), captures one call into a graph and keeps the graph
with its static inputs and outputs. Every later call with that signature
copies the inputs into the static buffers and replays the graph: one launch
from the host instead of one per kernel, and no Python per kernel.

The outputs returned are the graph's static output tensors: they are
overwritten by the next call with the same signature (``clone()`` them to keep
them), as with ``torch.cuda.graphs.make_graphed_callables``. Inputs not on a
CUDA device run the plain launcher. Capture and replay go through a backend
object (``CudaGraphs``), so the bookkeeping is tested on a CPU with a fake one.
"""

from __future__ import annotations

from collections.abc import Callable


class CudaGraphs:
    """The real backend: ``torch.cuda.CUDAGraph`` capture and replay."""

    def available(self, tensors) -> bool:
        """True when every input is a CUDA tensor."""
        return bool(tensors) and all(t.is_cuda for t in tensors)

    def capture(self, fn: Callable[[], dict]):
        """Warm up ``fn`` on a side stream, capture one call; (graph, its outputs)."""
        import torch

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # warm-up: Triton compiles and allocates outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = fn()
        return graph, outputs

    def replay(self, graph) -> None:
        """Launch the captured work."""
        graph.replay()


class GraphRunner:
    """``run`` of a generated module, captured once per input signature and replayed."""

    def __init__(self, run: Callable, names: list[str], backend=None,
                 max_graphs: int = 16) -> None:
        self.run, self.names = run, list(names)
        self.backend = backend or CudaGraphs()
        self.max_graphs = max_graphs
        self.graphs: dict[tuple, tuple] = {}  # signature -> (graph, static inputs, outputs)
        self.captures = self.replays = 0
        for attr in ("source", "path", "module"):
            if hasattr(run, attr):
                setattr(self, attr, getattr(run, attr))

    def _bind(self, args, kwargs) -> list:
        if len(args) == 1 and isinstance(args[0], dict) and not kwargs:
            kwargs, args = dict(args[0]), ()
        given = dict(zip(self.names, args), **kwargs)
        if set(given) != set(self.names) or len(args) > len(self.names):
            return []  # let the launcher name what is wrong
        return [given[n] for n in self.names]

    def __call__(self, /, *args, **kwargs) -> dict:
        """The outputs for these inputs (the static buffers of the captured graph)."""
        tensors = self._bind(args, kwargs)
        if not tensors or not all(hasattr(t, "is_cuda") for t in tensors) or \
                not self.backend.available(tensors):
            return self.run(*args, **kwargs)
        key = tuple((tuple(t.shape), t.dtype, t.device, t.stride()) for t in tensors)
        entry = self.graphs.get(key)
        if entry is None:
            if len(self.graphs) >= self.max_graphs:
                return self.run(*args, **kwargs)
            self.run(*tensors)  # checks the inputs (a bad call raises here, not in a capture)
            static = [t.clone() for t in tensors]
            graph, outputs = self.backend.capture(lambda: self.run(*static))
            entry = self.graphs[key] = (graph, static, outputs)
            self.captures += 1
        graph, static, outputs = entry
        for dst, src in zip(static, tensors):
            dst.copy_(src)
        self.backend.replay(graph)
        self.replays += 1
        return outputs
