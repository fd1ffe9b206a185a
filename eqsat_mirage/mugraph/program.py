"""The multi-level program: ``MuGraph`` (kernel graph), block graphs and thread graphs.

A ``MuGraph`` is a kernel graph: named device tensors (its inputs, and one
tensor per kernel output) and a list of kernels in execution order. A kernel
is either a ``PredefinedKernel`` (one IR op whose operands are device tensors,
as a library kernel would run it) or a ``CustomKernel`` defined by a block
graph:

- ``grid``: up to three grid axes (x, y, z); one thread block per grid point.
- ``forloop``: the loop range F; block inputs with an ``fmap`` are cut into F
  pieces along that dim, iteration f reading piece f.
- block inputs: ``BlockInput(name, tensor, imap, fmap)``; ``imap`` maps tensor
  dims to grid axes (the dim is cut into one tile per block along that axis);
  dims in neither map are read whole by every block. A dim in both maps is cut
  by the grid first and each block's part by the loop (as in Mirage: the tile
  is the dim over grid size x F), a split reduction with a loop inside each split.
- block ops on tiles, written in the kernel-level IR over tile shapes, in two
  stages: ``loop`` (run once per iteration) and ``post`` (after the loop).
- forloop accumulators: named loop values summed over the F iterations; in the
  post stage they (and the loop-invariant block inputs) are input tiles.
- block outputs: ``BlockOutput(tensor, stage, omap, fmap)``; the tile is
  written at the block's position (``omap``: tensor dim -> grid axis). A loop
  stage output with an ``fmap`` writes iteration f's tile to piece f; without
  one every iteration writes the same tile and the last write stays.
- thread graph: chains of elementwise block ops fused in registers
  (``threads``; metadata for the cost model and code generation).

Its meaning is defined by ``tiled.py``, which executes the tiling for real.
``kernels.py`` holds the kernels, ``validate.py`` their checks, ``facts.py`` the
reference graph and the static facts the verifier needs (Lax check, degree
bound), ``io.py`` the printed and JSON forms; this module assembles them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from numbers import Real
from typing import Any

from ..frontend.graph import Graph
from ..ir.check import check
from ..ir.errors import MirageError, ShapeError
from ..ir.limits import matmul_scratch
from ..ir.node import Node, Op, canonical_dtype, fmt_shape, make, toposort
from .facts import bit_degrees, check_lax, degrees, reference
from .io import (
    FORMAT,
    VERSION,
    custom_kernel_from_dict,
    format_mugraph,
    graph_from_dict,
    to_dict,
)
from .kernels import (
    CustomKernel,
    Kernel,
    MuGraphError,
    PredefinedKernel,
    TensorSpec,
    UnknownTensorError,
    check_name,
    check_read,
)
from .tiled import evaluate_field, evaluate_float, node_samples
from .validate import validate_kernel


class MuGraph:
    """A kernel graph of predefined and custom kernels over named device tensors.

    ``inputs`` maps input names to INPUT nodes (shape, dtype), as ``Graph``
    does; ``outputs`` maps output names to the ``TensorSpec`` holding them.
    ``em.evaluate`` and ``em.verify`` run it with the tiled interpreter.
    """

    def __init__(self, name: str = "mugraph") -> None:
        self.name = name
        self.inputs: dict[str, Node] = {}
        self.kernels: list[Kernel] = []
        self.output_tensors: dict[str, str] = {}  # output name -> device tensor

    # -- building ---------------------------------------------------------------------------
    def input(self, name: str, shape: Sequence[int], dtype: Any = "float16") -> str:
        """Declare device input ``name``; returns the name."""
        check_name(name, "input")
        if self.spec(name) is not None:
            raise MuGraphError(f"mugraph {self.name!r}: tensor {name!r} is already defined")
        shape = tuple(int(d) for d in shape)
        if any(d <= 0 for d in shape):
            raise ShapeError(f"input {name!r}: shape {fmt_shape(shape)} has a non-positive dim")
        self.inputs[name] = Node(Op.INPUT, (), name, shape, canonical_dtype(dtype))
        return name

    def kernel_name(self, name: str | None) -> str:
        """The name the next appended kernel gets: ``name``, or ``k<index>`` when None."""
        return name or f"k{len(self.kernels)}"

    def predefined(self, op: Op | str, *operands: str | float, arg: Any = None,
                   out: str | None = None, name: str | None = None) -> str:
        """Append a library kernel running ``op`` on device tensors; returns its output tensor."""
        op = op if isinstance(op, Op) else Op[str(op).upper()]
        kname = self.kernel_name(name)
        specs = self.tensors
        srcs, leaves = [], {}
        for x in operands:
            if isinstance(x, Real) and not isinstance(x, bool):
                srcs.append(Node(Op.CONST, (), float(x), (), "float32"))
                continue
            check_read(kname, x, specs)
            s = specs[x]
            srcs.append(leaves.setdefault(x, Node(Op.INPUT, (), x, s.shape, s.dtype)))
        try:
            node = make(op, tuple(srcs), arg)
        except ShapeError as exc:
            raise ShapeError(f"kernel {kname!r}: {exc}") from None
        out = check_name(out or self._fresh("t"), f"kernel {kname!r}: output tensor")
        if out in specs:
            raise MuGraphError(f"kernel {kname!r}: tensor {out!r} is already defined")
        self.kernels.append(PredefinedKernel(node, out, kname))
        return out

    def custom_kernel(self, grid: Sequence[int], forloop: int = 1, name: str | None = None,
                      source: Graph | None = None) -> CustomKernel:
        """Append a custom kernel with ``grid`` and loop range ``forloop``; build it in place."""
        kernel = CustomKernel(grid, forloop, self.kernel_name(name), source)
        kernel.owner = self
        self.kernels.append(kernel)
        return kernel

    def output(self, tensor: str, name: str | None = None) -> None:
        """Mark device ``tensor`` as output ``name`` (default: the tensor's name)."""
        name = check_name(name or tensor, "output")
        if self.spec(tensor) is None:
            raise UnknownTensorError(f"output {name!r}: unknown tensor {tensor!r}")
        if name in self.output_tensors or name in self.inputs:
            raise MuGraphError(f"output name {name!r} is already used")
        self.output_tensors[name] = tensor

    def _fresh(self, prefix: str) -> str:
        used, i = set(self.tensors) | set(self.output_tensors), 0
        while f"{prefix}{i}" in used:
            i += 1
        return f"{prefix}{i}"

    # -- facts ------------------------------------------------------------------------------
    @property
    def tensors(self) -> dict[str, TensorSpec]:
        """Every device tensor: the inputs, then each kernel's outputs in order."""
        specs = {n: TensorSpec(n, v.shape, v.dtype) for n, v in self.inputs.items()}
        for k in self.kernels:
            for t, spec in k.output_specs().items():
                specs.setdefault(t, spec)
        return specs

    def spec(self, tensor: str) -> TensorSpec | None:
        """Device tensor ``tensor`` as ``tensors`` holds it (None: not defined), found
        without making every kernel's specs (the planner lowers thousands of schedules)."""
        if tensor in self.inputs:
            node = self.inputs[tensor]
            return TensorSpec(tensor, node.shape, node.dtype)
        for k in self.kernels:
            if tensor in ((k.output,) if isinstance(k, PredefinedKernel) else k.outputs):
                return k.output_specs()[tensor]
        return None

    @property
    def outputs(self) -> dict[str, TensorSpec]:
        """Output name -> the device tensor holding it."""
        specs = self.tensors
        return {n: specs[t] for n, t in self.output_tensors.items() if t in specs}

    def validate(self) -> MuGraph:
        """Check every kernel in order; raises a ``MirageError`` naming kernel and tensor."""
        if not self.output_tensors:
            raise MuGraphError(f"mugraph {self.name!r} has no outputs (call mg.output(tensor))")
        self._check_names()
        known = {n: TensorSpec(n, v.shape, v.dtype) for n, v in self.inputs.items()}
        names: set[str] = set()
        for k in self.kernels:
            if k.name in names:
                raise MuGraphError(f"mugraph {self.name!r}: two kernels are named {k.name!r}")
            names.add(k.name)
            validate_kernel(k, known)
            for t, spec in k.output_specs().items():
                if t in known:
                    raise MuGraphError(f"kernel {k.name!r} writes tensor {t!r}, which is "
                                       f"already defined by {known[t].producer!r}")
                known[t] = spec
        for n, t in self.output_tensors.items():
            if t not in known:
                raise UnknownTensorError(f"output {n!r} of mugraph {self.name!r}: unknown tensor "
                                         f"{t!r}")
        return self

    def _check_names(self) -> None:
        """Every name a generated module could show (inputs, outputs, kernels, device tensors,
        block inputs and accumulators) must be a Python identifier, else ``MuGraphError``: a
        MuGraph read from JSON or a results cache names nothing else. The MuGraph's own name
        may be any string (code generation shows it only as a string literal)."""
        if not isinstance(self.name, str):
            raise MuGraphError(f"mugraph name {self.name!r} must be a string")
        for n in self.inputs:
            check_name(n, f"mugraph {self.name!r}: input")
        for n, t in self.output_tensors.items():
            check_name(n, f"mugraph {self.name!r}: output")
            check_name(t, f"mugraph {self.name!r}: output {n!r}: tensor")
        for k in self.kernels:
            check_name(k.name, f"mugraph {self.name!r}: kernel")
            if isinstance(k, PredefinedKernel):
                check_name(k.output, f"kernel {k.name!r}: output tensor")
                continue
            for n, bi in k.inputs.items():
                check_name(n, f"kernel {k.name!r}: block input")
                check_name(bi.tensor, f"kernel {k.name!r}: block input {n!r}: tensor")
            for n in [*k.outputs, *k.accumulators, *k.maxima]:
                check_name(n, f"kernel {k.name!r}: block output or accumulator")

    def check_lax(self, what: str = "program") -> None:
        """Validate, then raise ``LaxError`` if some path takes exp twice (tiles included)."""
        check_lax(self.validate(), what)

    def materialized(self) -> set[str]:
        """Tensors that must exist in device memory: the outputs and what predefined (library)
        kernels read. A causal mask outside it is computed from positions by its readers."""
        return set(self.output_tensors.values()) | {
            s.arg for k in self.kernels if k.kind == "predefined" for s in k.node.srcs
            if s.op is Op.INPUT}

    def footprint(self) -> list[tuple[str, int]]:
        """(description, element count) of every value the tiled interpreter holds: each
        device tensor, and each block value over all blocks of its kernel at once."""
        out = [(f"tensor {t!r} {fmt_shape(spec.shape)}", math.prod(spec.shape))
               for t, spec in self.tensors.items()]
        for k in self.kernels:
            if k.kind == "custom":
                blocks = math.prod(k.grid)
                for n in (n for stage in (k.loop, k.post) for n in stage.nodes()):
                    out.append((f"kernel {k.name!r}: block value {fmt_shape(n.shape)} x "
                                f"{blocks} blocks", blocks * math.prod(n.shape)))
                    if n.op is Op.MATMUL:
                        out.append((f"kernel {k.name!r}: matmul {fmt_shape(n.shape)} x "
                                    f"{blocks} blocks: exact digit products",
                                    matmul_scratch(n, blocks)))
                if k.forloop > 1:  # a summed loop matmul's operands, kept for every iteration
                    out += [(f"kernel {k.name!r}: matmul operands {fmt_shape(m.srcs[0].shape)} "
                             f"and {fmt_shape(m.srcs[1].shape)} x {blocks} blocks x "
                             f"{k.forloop} iterations", 4 * blocks * k.forloop * sum(
                                 math.prod(s.shape) for s in m.srcs))
                            for a in k.accumulators
                            if (m := k.loop.outputs.get(a)) is not None and m.op is Op.MATMUL]
        return out

    def degrees(self) -> dict:
        """Degree facts of each output (``bound.Degree``) from the tiled computation."""
        return degrees(self)

    def bit_degrees(self) -> dict:
        """The bit degree of each output (``bound.bit_degree``: how many comparison bits are
        multiplied together at most) from the tiled computation."""
        return bit_degrees(self)

    def reference(self) -> Graph:
        """The kernel-level Graph this MuGraph computes (custom kernels by their ``source``)."""
        return reference(self.validate())

    # -- running ----------------------------------------------------------------------------
    def evaluate(self, inputs: Mapping[str, Any], dtype: str | None = None,
                 rounded: bool = False) -> dict:
        """Run the tiling for real over floats (see ``semantics.floating.evaluate`` for dtype
        and ``rounded``)."""
        return evaluate_float(self, inputs, dtype, rounded)

    def node_samples(self, inputs: Mapping[str, Any], wanted: set[int], pick,
                     outputs: dict | None = None) -> dict:
        """``pick`` of the float64 values of the kernel nodes whose ids are ``wanted``
        (``tiled.node_samples``: block-graph, predefined-kernel and input nodes; its
        ``outputs`` filled with the run's outputs)."""
        return node_samples(self, inputs, wanted, pick, outputs)

    def evaluate_field(self, ctx) -> dict:
        """Run the tiling for real over Z_p x Z_q with the trial ``ctx`` (a ``FieldCtx``)."""
        return evaluate_field(self, ctx)

    def memory_peak(self, field: bool, lazy: bool = False) -> tuple[int, int, int, str]:
        """What one run of the tiled interpreter holds (``mugraph/memory.py``; ``lazy``:
        inputs made as they are read): the verifier's memory estimate asks the program, as
        it asks it to evaluate itself."""
        from .memory import mugraph_peak

        return mugraph_peak(self, field, lazy)

    # -- conversions ------------------------------------------------------------------------
    @classmethod
    def from_graph(cls, graph: Graph) -> MuGraph:
        """The one-kernel-per-op MuGraph of ``graph`` (all predefined kernels)."""
        return from_graph(graph)

    def to_dict(self) -> dict:
        """A JSON-compatible dict (see ``to_json``)."""
        return to_dict(self)

    def to_json(self, indent: int | None = None) -> str:
        """Serialize to a JSON string; ``MuGraph.from_json`` reads it back."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Mapping) -> MuGraph:
        """Rebuild (and validate) a MuGraph from ``to_dict`` output."""
        return from_dict(data).validate()

    @classmethod
    def from_json(cls, text: str) -> MuGraph:
        """Rebuild (and validate) a MuGraph from ``to_json`` output; ``MuGraphError`` for
        text that is not such JSON (nesting too deep included)."""
        try:
            data = json.loads(text)
        except RecursionError:
            raise MuGraphError("malformed serialized MuGraph: nested too deeply") from None
        except ValueError as exc:
            raise MuGraphError(f"malformed serialized MuGraph: not JSON ({exc})") from None
        return cls.from_dict(data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MuGraph) and self.to_dict() == other.to_dict()

    __hash__ = None  # mutable while being built

    def __str__(self) -> str:
        return format_mugraph(self)

    def __repr__(self) -> str:
        kinds = [k.kind for k in self.kernels]
        return (f"MuGraph({self.name!r}, inputs={list(self.inputs)}, "
                f"outputs={list(self.output_tensors)}, kernels={len(kinds)}, "
                f"custom={kinds.count('custom')})")


def from_graph(graph: Graph) -> MuGraph:
    """The one-kernel-per-op MuGraph of ``graph``: the baseline program of the search."""
    check(graph)
    mg = MuGraph(graph.name)
    for name, node in graph.inputs.items():
        mg.input(name, node.shape, node.dtype)
    out_names: dict[int, str] = {}
    for name, node in graph.outputs.items():
        out_names.setdefault(id(node), name)
    used = set(graph.inputs) | set(graph.outputs)
    tensor_of: dict[int, str] = {id(n): name for name, n in graph.inputs.items()}
    count = 0
    for node in toposort(list(graph.outputs.values())):
        if node.op in (Op.INPUT, Op.CONST):
            continue
        out = out_names.get(id(node))
        if out is None:
            while f"t{count}" in used:
                count += 1
            out = f"t{count}"
            used.add(out)
        leaves: dict[str, Node] = {}
        srcs = tuple(s if s.op is Op.CONST else leaves.setdefault(
            tensor_of[id(s)], Node(Op.INPUT, (), tensor_of[id(s)], s.shape, s.dtype))
            for s in node.srcs)
        mg.kernels.append(PredefinedKernel(Node(node.op, srcs, node.arg, node.shape, node.dtype),
                                           out, mg.kernel_name(None)))
        tensor_of[id(node)] = out
    for name, node in graph.outputs.items():
        mg.output(tensor_of[id(node)], name)
    return mg


def from_dict(data: Mapping) -> MuGraph:
    """Rebuild a MuGraph from ``to_dict`` output (not yet validated)."""
    if not isinstance(data, Mapping) or data.get("format") != FORMAT:
        fmt = data.get("format") if isinstance(data, Mapping) else type(data).__name__
        raise MuGraphError(f"not a serialized MuGraph (format {fmt!r}, expected {FORMAT!r})")
    if data.get("version", VERSION) != VERSION:
        raise MuGraphError(f"serialized MuGraph {data.get('name', '?')!r} has version "
                           f"{data.get('version')!r}; this eqsat-mirage reads version {VERSION}")
    try:
        return _from_dict(data)
    except RecursionError:
        raise MuGraphError(f"malformed serialized MuGraph {data.get('name', '?')!r}: nested "
                           "too deeply") from None
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, MirageError):
            raise
        raise MuGraphError(f"malformed serialized MuGraph {data.get('name', '?')!r}: "
                           f"{exc!r}") from None


def _from_dict(data: Mapping) -> MuGraph:
    if not isinstance(data["name"], str):
        raise MuGraphError(f"serialized MuGraph: name {data['name']!r} is not a string")
    for part, kind in (("inputs", list), ("kernels", list), ("outputs", Mapping)):
        if not isinstance(data[part], kind):
            raise MuGraphError(f"malformed serialized MuGraph {data['name']!r}: {part!r} is "
                               f"{type(data[part]).__name__}, not a JSON "
                               + ("array" if kind is list else "object"))
    mg = MuGraph(data["name"])
    for inp in data["inputs"]:
        mg.input(inp["name"], inp["shape"], inp["dtype"])
    for d in data["kernels"]:
        try:
            if d["kind"] == "predefined":
                frag = graph_from_dict(d["graph"])
                k = PredefinedKernel(frag.outputs[d["output"]], d["output"], d["name"])
            else:
                k = custom_kernel_from_dict(d)
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            name = d.get("name", "?") if isinstance(d, Mapping) else d
            raise MuGraphError(f"kernel {name!r}: malformed JSON ({exc!r})") from None
        if isinstance(k, CustomKernel):
            k.owner = mg
        mg.kernels.append(k)
    mg.output_tensors = dict(data["outputs"])
    return mg
