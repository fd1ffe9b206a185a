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
``mugraph_facts.py`` holds validation, the reference graph, ``from_graph`` and
the static facts the verifier needs (Lax check, degree bound); ``mugraph_io.py``
the printed and JSON forms.
"""

from __future__ import annotations

import keyword
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

from .errors import GraphError, ShapeError
from .graph import Graph, Tensor
from .ir import ELEMENTWISE, Node, Op, Shape, canonical_dtype, fmt_shape, make

GRID_AXES = "xyz"


class MuGraphError(GraphError):
    """A malformed MuGraph: unknown tensors, bad kernels, bad maps (names kernel and tensor)."""


class UnknownTensorError(MuGraphError):
    """A kernel reads a device tensor that no input or earlier kernel defines."""


class TilingError(MuGraphError, ShapeError):
    """A tiling that does not fit its tensors: tile not dividing a dim, axis used twice, ..."""


@dataclass(frozen=True)
class TensorSpec:
    """A device tensor: name, shape, dtype and what defines it ("input" or a kernel name)."""

    name: str
    shape: Shape
    dtype: str
    producer: str = "input"


@dataclass
class BlockInput:
    """A block input: ``tensor`` read as tile ``name``, cut by ``imap`` and ``fmap``."""

    name: str
    tensor: str
    imap: dict[int, int] = field(default_factory=dict)
    fmap: int | None = None


@dataclass
class BlockOutput:
    """A block output: stage (loop or post) node written to ``tensor`` by ``omap``/``fmap``."""

    tensor: str
    stage: str  # "loop" or "post"
    omap: dict[int, int] = field(default_factory=dict)
    fmap: int | None = None


def axis_name(axis: int) -> str:
    """The printed name of grid axis ``axis`` (x, y, z)."""
    return GRID_AXES[axis] if 0 <= axis < len(GRID_AXES) else f"axis{axis}"


def fmt_map(m: Mapping[int, int]) -> str:
    """Format a dim -> grid axis map as ``{0: x, 1: y}``."""
    return "{" + ", ".join(f"{d}: {axis_name(a)}" for d, a in sorted(m.items())) + "}"


def _check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise MuGraphError(f"{what} name {name!r} must be a Python identifier")
    return name


class PredefinedKernel:
    """A library kernel: one IR op ``node`` whose INPUT leaves are named device tensors."""

    kind = "predefined"

    def __init__(self, node: Node, output: str, name: str = "") -> None:
        self.node = node
        self.output = output
        self.name = name

    def reads(self) -> list[str]:
        """Device tensors the kernel reads, in operand order."""
        return list(dict.fromkeys(s.arg for s in self.node.srcs if s.op is Op.INPUT))

    def output_specs(self) -> dict[str, TensorSpec]:
        """The device tensor this kernel writes."""
        return {self.output: TensorSpec(self.output, self.node.shape, self.node.dtype, self.name)}

    def validate(self, known: Mapping[str, TensorSpec]) -> None:
        """Check the op, its operands against the device tensors, and its shape."""
        from .mugraph_facts import validate_predefined

        validate_predefined(self, known)


def _check_read(kernel: str, tensor: str, known: Mapping[str, TensorSpec]) -> None:
    if tensor not in known:
        raise UnknownTensorError(
            f"kernel {kernel!r} reads tensor {tensor!r}, which is neither an input nor written "
            f"by an earlier kernel (known: {', '.join(known) or 'none'})")


class CustomKernel:
    """A kernel defined by a block graph (see the module docstring).

    Built with ``MuGraph.custom_kernel`` and then ``input``, ``accumulate``,
    ``tile``, ``output`` and ``fuse``; ``source`` optionally holds the
    kernel-level Graph fragment it implements (inputs and outputs named after
    device tensors), used by ``MuGraph.reference``.
    """

    kind = "custom"

    def __init__(self, grid: Sequence[int], forloop: int = 1, name: str = "",
                 source: Graph | None = None) -> None:
        self.name = name
        self.grid = tuple(grid) if isinstance(grid, Sequence) else (grid,)
        self.forloop = forloop
        self.inputs: dict[str, BlockInput] = {}
        self.loop = Graph(f"{name}.loop")  # outputs: accumulators and loop-stage outputs
        self.post = Graph(f"{name}.post")  # outputs: post-stage outputs (by tensor name)
        self.accumulators: list[str] = []
        self.outputs: dict[str, BlockOutput] = {}
        self.threads: list[tuple[str, tuple[Node, ...]]] = []
        self.source = source
        self._owner: MuGraph | None = None

    # -- building ---------------------------------------------------------------------------
    def _spec(self, tensor: str) -> TensorSpec:
        specs = self._owner.tensors if self._owner is not None else {}
        _check_read(self.name, tensor, specs)
        return specs[tensor]

    def input(self, tensor: str, imap: Mapping[int, int] | None = None, fmap: int | None = None,
              name: str | None = None) -> Tensor:
        """Read device ``tensor`` as a tile; returns the tile in the loop stage."""
        name = _check_name(name or tensor, f"kernel {self.name!r}: block input")
        if name in self.inputs:
            raise MuGraphError(f"kernel {self.name!r}: block input {name!r} declared twice")
        bi = BlockInput(name, tensor, dict(imap or {}), fmap)
        spec = self._spec(tensor)
        tile = tile_shape(self, bi, spec)
        self.inputs[name] = bi
        return self.loop.input(name, tile, spec.dtype)

    def tile(self, name: str) -> Tensor:
        """The post-stage tile of a block input without fmap (read whole in every iteration)."""
        if name in self.post.inputs:
            return Tensor(self.post.inputs[name], self.post)
        bi = self.inputs.get(name)
        if bi is None or bi.fmap is not None:
            raise MuGraphError(f"kernel {self.name!r}: {name!r} is not a block input without "
                               "fmap; after the loop only those and accumulators can be read")
        node = self.loop.inputs[name]
        return self.post.input(name, node.shape, node.dtype)

    def accumulate(self, value: Tensor, name: str) -> Tensor:
        """Sum the loop value ``value`` over the F iterations; returns it in the post stage."""
        name = _check_name(name, f"kernel {self.name!r}: accumulator")
        if not isinstance(value, Tensor) or value.graph is not self.loop:
            raise MuGraphError(f"kernel {self.name!r}: accumulator {name!r} must be a value "
                               "computed in the loop stage of this kernel")
        self.loop.output(value, name)
        self.accumulators.append(name)
        return self.post.input(name, value.shape, value.dtype)

    def output(self, value: Tensor, tensor: str, omap: Mapping[int, int] | None = None,
               fmap: int | None = None) -> str:
        """Write tile ``value`` to new device tensor ``tensor`` by ``omap`` (and ``fmap``)."""
        tensor = _check_name(tensor, f"kernel {self.name!r}: output tensor")
        if not isinstance(value, Tensor) or value.graph not in (self.loop, self.post):
            raise MuGraphError(f"kernel {self.name!r}: output {tensor!r} must be a tile of this "
                               "kernel's loop or post stage")
        stage = "loop" if value.graph is self.loop else "post"
        if self._owner is not None and tensor in self._owner.tensors:
            raise MuGraphError(f"kernel {self.name!r}: tensor {tensor!r} is already defined")
        value.graph.output(value, tensor)
        self.outputs[tensor] = BlockOutput(tensor, stage, dict(omap or {}), fmap)
        return tensor

    def fuse(self, *values: Tensor) -> None:
        """Record a thread graph: a chain of elementwise tiles of one stage fused in registers."""
        stages = {v.graph for v in values if isinstance(v, Tensor)}
        if len(stages) != 1 or len(values) < 1 or not stages <= {self.loop, self.post}:
            raise MuGraphError(f"kernel {self.name!r}: a thread chain is a list of tiles of one "
                               "stage (loop or post) of this kernel")
        stage = "loop" if stages == {self.loop} else "post"
        self.threads.append((stage, tuple(v.node for v in values)))

    # -- facts ------------------------------------------------------------------------------
    def stage(self, stage: str) -> Graph:
        """The loop or post stage graph."""
        return self.loop if stage == "loop" else self.post

    def output_node(self, tensor: str) -> Node:
        """The tile node written to ``tensor``."""
        return self.stage(self.outputs[tensor].stage).outputs[tensor]

    def per_iteration(self) -> set[int]:
        """ids of the loop-stage nodes that depend on an fmap tile (they run every iteration;
        the rest run once, before the loop: the cost model and the code generator agree)."""
        variant = {id(n) for n in self.loop.inputs.values()
                   if self.inputs[n.arg].fmap is not None}
        for n in self.loop.nodes():
            if any(id(s) in variant for s in n.srcs):
                variant.add(id(n))
        return variant

    def reads(self) -> list[str]:
        """Device tensors the kernel reads."""
        return list(dict.fromkeys(bi.tensor for bi in self.inputs.values()))

    def output_specs(self) -> dict[str, TensorSpec]:
        """The device tensors this kernel writes, shapes derived from tiles and maps."""
        out = {}
        for t, bo in self.outputs.items():
            node = self.output_node(t)
            shape = tuple(d * self.grid[bo.omap[i]] if i in bo.omap and 0 <= bo.omap[i] <
                          len(self.grid) else d * self.forloop if i == bo.fmap else d
                          for i, d in enumerate(node.shape))
            out[t] = TensorSpec(t, shape, node.dtype, self.name)
        return out

    def validate(self, known: Mapping[str, TensorSpec]) -> None:
        """Check grid, loop, maps, tiles, stages, outputs and threads against ``known``."""
        from .mugraph_facts import validate_custom

        validate_custom(self, known)


def tile_shape(kernel: CustomKernel, bi: BlockInput, spec: TensorSpec) -> Shape:
    """The tile shape of block input ``bi`` over ``spec``; raises ``TilingError``."""
    who = (f"kernel {kernel.name!r}: block input {bi.name!r} reading {spec.name!r} "
           f"{fmt_shape(spec.shape)}")
    ndim, grid = len(spec.shape), kernel.grid
    _check_map(bi.imap, ndim, len(grid), f"{who}: imap {fmt_map(bi.imap)}")
    if bi.fmap is not None:
        if not isinstance(bi.fmap, int) or not 0 <= bi.fmap < ndim:
            raise TilingError(f"{who}: fmap {bi.fmap!r} is not a dim of a {ndim}-d tensor")
    tile = []
    for d, size in enumerate(spec.shape):
        # a dim in both maps is cut by the grid first, then each block's part by the loop
        parts = (grid[bi.imap[d]] if d in bi.imap else 1) * (kernel.forloop if d == bi.fmap
                                                             else 1)
        if size % parts:
            what = " times the ".join(
                ([f"grid axis {axis_name(bi.imap[d])} of size {grid[bi.imap[d]]}"]
                 if d in bi.imap else []) + ([f"forloop range {kernel.forloop}"]
                                             if d == bi.fmap else []))
            raise TilingError(f"{who}: dim {d} of size {size} is not divisible by the {what}")
        tile.append(size // parts)
    return tuple(tile)


def _check_map(m: Any, ndim: int, naxes: int, who: str) -> None:
    if not isinstance(m, Mapping):
        raise TilingError(f"{who}: a map must be a dict tensor dim -> grid axis")
    for d, a in m.items():
        if not isinstance(d, int) or not 0 <= d < ndim:
            raise TilingError(f"{who}: {d!r} is not a dim of a {ndim}-d tensor")
        if not isinstance(a, int) or not 0 <= a < naxes:
            raise TilingError(f"{who}: grid axis {a!r} does not exist (grid has {naxes} axes)")
    axes = list(m.values())
    for a in set(axes):
        if axes.count(a) > 1:
            dims = [d for d, x in m.items() if x == a]
            raise TilingError(f"{who}: grid axis {axis_name(a)} used twice (dims {dims})")


Kernel = PredefinedKernel | CustomKernel


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
        _check_name(name, "input")
        if name in self.tensors:
            raise MuGraphError(f"mugraph {self.name!r}: tensor {name!r} is already defined")
        shape = tuple(int(d) for d in shape)
        if any(d <= 0 for d in shape):
            raise ShapeError(f"input {name!r}: shape {fmt_shape(shape)} has a non-positive dim")
        self.inputs[name] = Node(Op.INPUT, (), name, shape, canonical_dtype(dtype))
        return name

    def _kernel_name(self, name: str | None) -> str:
        return name or f"k{len(self.kernels)}"

    def predefined(self, op: Op | str, *operands: str | float, arg: Any = None,
                   out: str | None = None, name: str | None = None) -> str:
        """Append a library kernel running ``op`` on device tensors; returns its output tensor."""
        op = op if isinstance(op, Op) else Op[str(op).upper()]
        kname = self._kernel_name(name)
        specs = self.tensors
        srcs, leaves = [], {}
        for x in operands:
            if isinstance(x, Real) and not isinstance(x, bool):
                srcs.append(Node(Op.CONST, (), float(x), (), "float32"))
                continue
            _check_read(kname, x, specs)
            s = specs[x]
            srcs.append(leaves.setdefault(x, Node(Op.INPUT, (), x, s.shape, s.dtype)))
        try:
            node = make(op, tuple(srcs), arg)
        except ShapeError as exc:
            raise ShapeError(f"kernel {kname!r}: {exc}") from None
        out = _check_name(out or self._fresh("t"), f"kernel {kname!r}: output tensor")
        if out in specs:
            raise MuGraphError(f"kernel {kname!r}: tensor {out!r} is already defined")
        self.kernels.append(PredefinedKernel(node, out, kname))
        return out

    def custom_kernel(self, grid: Sequence[int], forloop: int = 1, name: str | None = None,
                      source: Graph | None = None) -> CustomKernel:
        """Append a custom kernel with ``grid`` and loop range ``forloop``; build it in place."""
        kernel = CustomKernel(grid, forloop, self._kernel_name(name), source)
        kernel._owner = self
        self.kernels.append(kernel)
        return kernel

    def output(self, tensor: str, name: str | None = None) -> None:
        """Mark device ``tensor`` as output ``name`` (default: the tensor's name)."""
        name = _check_name(name or tensor, "output")
        if tensor not in self.tensors:
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

    @property
    def outputs(self) -> dict[str, TensorSpec]:
        """Output name -> the device tensor holding it."""
        specs = self.tensors
        return {n: specs[t] for n, t in self.output_tensors.items() if t in specs}

    def validate(self) -> MuGraph:
        """Check every kernel in order; raises a ``MirageError`` naming kernel and tensor."""
        if not self.output_tensors:
            raise MuGraphError(f"mugraph {self.name!r} has no outputs (call mg.output(tensor))")
        known = {n: TensorSpec(n, v.shape, v.dtype) for n, v in self.inputs.items()}
        names: set[str] = set()
        for k in self.kernels:
            if k.name in names:
                raise MuGraphError(f"mugraph {self.name!r}: two kernels are named {k.name!r}")
            names.add(k.name)
            k.validate(known)
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

    def check_lax(self, what: str = "program") -> None:
        """Validate, then raise ``LaxError`` if some path takes exp twice (tiles included)."""
        from .mugraph_facts import check_lax

        check_lax(self.validate(), what)

    def degrees(self) -> dict:
        """Degree facts of each output (``bound.Degree``) from the tiled computation."""
        from .mugraph_facts import degrees

        return degrees(self)

    def reference(self) -> Graph:
        """The kernel-level Graph this MuGraph computes (custom kernels by their ``source``)."""
        from .mugraph_facts import reference

        return reference(self.validate())

    # -- running ----------------------------------------------------------------------------
    def evaluate(self, inputs: Mapping[str, Any], dtype: str | None = None) -> dict:
        """Run the tiling for real over floats (see ``semantics_float.evaluate`` for dtype)."""
        from .tiled import evaluate_float

        return evaluate_float(self, inputs, dtype)

    def evaluate_field(self, ctx) -> dict:
        """Run the tiling for real over Z_p x Z_q with the trial ``ctx`` (a ``FieldCtx``)."""
        from .tiled import evaluate_field

        return evaluate_field(self, ctx)

    # -- conversions ------------------------------------------------------------------------
    @classmethod
    def from_graph(cls, graph: Graph) -> MuGraph:
        """The one-kernel-per-op MuGraph of ``graph`` (all predefined kernels)."""
        from .mugraph_facts import from_graph

        return from_graph(graph)

    def to_dict(self) -> dict:
        """A JSON-compatible dict (see ``to_json``)."""
        from .mugraph_io import to_dict

        return to_dict(self)

    def to_json(self, indent: int | None = None) -> str:
        """Serialize to a JSON string; ``MuGraph.from_json`` reads it back."""
        import json

        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Mapping) -> MuGraph:
        """Rebuild (and validate) a MuGraph from ``to_dict`` output."""
        from .mugraph_io import from_dict

        return from_dict(data).validate()

    @classmethod
    def from_json(cls, text: str) -> MuGraph:
        """Rebuild (and validate) a MuGraph from ``to_json`` output."""
        import json

        return cls.from_dict(json.loads(text))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MuGraph) and self.to_dict() == other.to_dict()

    __hash__ = None  # mutable while being built

    def __str__(self) -> str:
        from .mugraph_io import format_mugraph

        return format_mugraph(self)

    def __repr__(self) -> str:
        kinds = [k.kind for k in self.kernels]
        return (f"MuGraph({self.name!r}, inputs={list(self.inputs)}, "
                f"outputs={list(self.output_tensors)}, kernels={len(kinds)}, "
                f"custom={kinds.count('custom')})")


def is_elementwise(node: Node) -> bool:
    """Whether a block op may sit in a thread chain."""
    return node.op in ELEMENTWISE
