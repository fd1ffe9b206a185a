"""The parts of a MuGraph: device tensor specs, block inputs and outputs, and the two kernels.

A ``PredefinedKernel`` is one IR op over device tensors (a library kernel); a
``CustomKernel`` is a block graph (grid, forloop, tiles cut by imap/fmap, loop
and post stages, accumulators, outputs by omap, thread chains). ``program.py``
assembles them into a ``MuGraph``; ``validate.py`` checks them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..frontend.graph import Graph, Tensor
from ..ir.errors import GraphError, ShapeError
from ..ir.node import ELEMENTWISE, Node, Op, Shape, fmt_shape

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
    dtype: str | None = None  # the tensor's dtype when not the tile's (fp32 split partials)


def axis_name(axis: int) -> str:
    """The printed name of grid axis ``axis`` (x, y, z)."""
    return GRID_AXES[axis] if 0 <= axis < len(GRID_AXES) else f"axis{axis}"


def fmt_map(m: Mapping[int, int]) -> str:
    """Format a dim -> grid axis map as ``{0: x, 1: y}``."""
    return "{" + ", ".join(f"{d}: {axis_name(a)}" for d, a in sorted(m.items())) + "}"


def check_name(name: Any, what: str) -> str:
    """``name``, which must be a Python identifier (else ``MuGraphError`` naming ``what``);
    a keyword is one (issue 51: an input may be called ``class``): generated code holds a
    name only as a string literal or a mangled identifier (``codegen.tiles.identifier``)."""
    if not isinstance(name, str) or not name.isidentifier():
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


def check_read(kernel: str, tensor: str, known: Mapping[str, TensorSpec]) -> None:
    """Raise ``UnknownTensorError`` unless ``kernel`` reads a ``known`` device tensor."""
    if tensor not in known:
        raise UnknownTensorError(
            f"kernel {kernel!r} reads tensor {tensor!r}, which is neither an input nor written "
            f"by an earlier kernel (known: {', '.join(known) or 'none'})")


class CustomKernel:
    """A kernel defined by a block graph (see the module docstring).

    Built with ``MuGraph.custom_kernel`` and then ``input``, ``accumulate``,
    ``tile``, ``output`` and ``fuse``; ``source`` optionally holds the
    kernel-level Graph fragment it implements (inputs and outputs named after
    device tensors), used by ``MuGraph.reference``. ``owner`` is the MuGraph
    whose device tensors the kernel reads (None for a kernel built on its own).
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
        self.maxima: list[str] = []  # accumulators combined by max, not sum (running maxima)
        self.outputs: dict[str, BlockOutput] = {}
        self.threads: list[tuple[str, tuple[Node, ...]]] = []
        self.source = source
        self.num_warps: int | None = None  # set by the compile check; None: the cost model's
        self.owner = None  # the MuGraph building it (MuGraph.custom_kernel and from_dict set it)

    # -- building ---------------------------------------------------------------------------
    def _spec(self, tensor: str) -> TensorSpec:
        spec = self.owner.spec(tensor) if self.owner is not None else None
        if spec is None:
            check_read(self.name, tensor, self.owner.tensors if self.owner is not None else {})
        return spec

    def input(self, tensor: str, imap: Mapping[int, int] | None = None, fmap: int | None = None,
              name: str | None = None) -> Tensor:
        """Read device ``tensor`` as a tile; returns the tile in the loop stage."""
        name = check_name(name or tensor, f"kernel {self.name!r}: block input")
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

    def accumulate(self, value: Tensor, name: str, how: str = "sum") -> Tensor:
        """Sum (``how="sum"``) or take the max (``how="max"``: a running maximum, read in
        the loop with ``running``) of the loop value ``value`` over the F iterations;
        returns the total in the post stage.

        A sum accumulator whose loop value reads a running maximum m is rescaled as m
        grows (online softmax): after iteration f it holds
        ``sum_{g <= f} exp(m_g - m_f) * value_g(m_g)``, so a value ``exp(s_g - m) @ v_g``
        sums to ``exp(s - m_F) @ v`` over the whole loop.
        """
        if how not in ("sum", "max"):
            raise MuGraphError(f"kernel {self.name!r}: accumulator {name!r}: how={how!r} is "
                               "not 'sum' or 'max'")
        if how == "max":
            self.maxima.append(str(name))
        name = check_name(name, f"kernel {self.name!r}: accumulator")
        if not isinstance(value, Tensor) or value.graph is not self.loop:
            raise MuGraphError(f"kernel {self.name!r}: accumulator {name!r} must be a value "
                               "computed in the loop stage of this kernel")
        self.loop.output(value, name)
        self.accumulators.append(name)
        return self.post.input(name, value.shape, value.dtype)

    def running(self, name: str) -> Tensor:
        """The running maximum of max accumulator ``name`` after this iteration, as a loop
        tile (named ``<name>_run``): what an online softmax subtracts before its exp."""
        if name not in self.maxima:
            raise MuGraphError(f"kernel {self.name!r}: {name!r} is not a max accumulator "
                               f"(max accumulators: {self.maxima or 'none'})")
        run = f"{name}_run"
        if run in self.loop.inputs:
            return Tensor(self.loop.inputs[run], self.loop)
        node = self.loop.outputs[name]
        return self.loop.input(run, node.shape, node.dtype)

    def running_inputs(self) -> dict[str, str]:
        """Loop tile name -> max accumulator, for the running maxima the loop reads."""
        return {f"{a}_run": a for a in self.maxima if f"{a}_run" in self.loop.inputs}

    def rescaled(self) -> dict[str, str]:
        """Sum accumulator -> the max accumulator whose running value its loop value reads
        (it is rescaled by exp(m_old - m_new) as that maximum grows)."""
        runs = {id(self.loop.inputs[r]): a for r, a in self.running_inputs().items()}
        reads: dict[int, set[str]] = {}
        for n in self.loop.nodes():
            reads[id(n)] = {runs[id(n)]} if id(n) in runs else set().union(
                *(reads[id(s)] for s in n.srcs))
        out = {}
        for a in self.accumulators:
            if a not in self.maxima and reads[id(self.loop.outputs[a])]:
                found = sorted(reads[id(self.loop.outputs[a])])
                if len(found) > 1:
                    raise MuGraphError(f"kernel {self.name!r}: accumulator {a!r} reads the "
                                       f"running maxima {found}; at most one can rescale it")
                out[a] = found[0]
        return out

    def output(self, value: Tensor, tensor: str, omap: Mapping[int, int] | None = None,
               fmap: int | None = None, dtype: str | None = None) -> str:
        """Write tile ``value`` to new device tensor ``tensor`` by ``omap`` (and ``fmap``),
        stored as ``dtype`` (default: the tile's; a split writes its partials as float32)."""
        tensor = check_name(tensor, f"kernel {self.name!r}: output tensor")
        if not isinstance(value, Tensor) or value.graph not in (self.loop, self.post):
            raise MuGraphError(f"kernel {self.name!r}: output {tensor!r} must be a tile of this "
                               "kernel's loop or post stage")
        stage = "loop" if value.graph is self.loop else "post"
        if self.owner is not None and self.owner.spec(tensor) is not None:
            raise MuGraphError(f"kernel {self.name!r}: tensor {tensor!r} is already defined")
        if dtype is not None and dtype not in ("float16", "bfloat16", "float32"):
            raise MuGraphError(f"kernel {self.name!r}: output {tensor!r}: unknown dtype "
                               f"{dtype!r}")
        value.graph.output(value, tensor)
        self.outputs[tensor] = BlockOutput(tensor, stage, dict(omap or {}), fmap,
                                           None if dtype == value.dtype else dtype)
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
    def thread_interiors(self) -> set[int]:
        """ids of the tiles inside a thread chain (all but each chain's last): fused in
        registers, they never take shared memory."""
        return {id(n) for _, chain in self.threads for n in chain[:-1]}

    def stage(self, stage: str) -> Graph:
        """The loop or post stage graph."""
        return self.loop if stage == "loop" else self.post

    def output_node(self, tensor: str) -> Node:
        """The tile node written to ``tensor``."""
        return self.stage(self.outputs[tensor].stage).outputs[tensor]

    def per_iteration(self) -> set[int]:
        """ids of the loop-stage nodes that depend on an fmap tile (they run every iteration;
        the rest run once, before the loop: the cost model and the code generator agree)."""
        runs = self.running_inputs()  # a running maximum changes every iteration too
        variant = {id(n) for n in self.loop.inputs.values()
                   if n.arg in runs or self.inputs[n.arg].fmap is not None}
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
            shape = tuple([d * self.grid[bo.omap[i]] if i in bo.omap and 0 <= bo.omap[i] <
                           len(self.grid) else d * self.forloop if i == bo.fmap else d
                           for i, d in enumerate(node.shape)])
            out[t] = TensorSpec(t, shape, bo.dtype or node.dtype, self.name)
        return out


def tile_shape(kernel: CustomKernel, bi: BlockInput, spec: TensorSpec) -> Shape:
    """The tile shape of block input ``bi`` over ``spec``; raises ``TilingError``."""
    def named() -> str:  # the message's subject, written only for an error (the planner
        return (f"kernel {kernel.name!r}: block input {bi.name!r} reading {spec.name!r} "
                f"{fmt_shape(spec.shape)}")  # declares tiles by the ten thousand)

    ndim, grid = len(spec.shape), kernel.grid
    check_map(bi.imap, ndim, len(grid), lambda: f"{named()}: imap {fmt_map(bi.imap)}")
    if bi.fmap is not None:
        if not isinstance(bi.fmap, int) or not 0 <= bi.fmap < ndim:
            raise TilingError(f"{named()}: fmap {bi.fmap!r} is not a dim of a {ndim}-d tensor")
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
            raise TilingError(f"{named()}: dim {d} of size {size} is not divisible by the "
                              f"{what}")
        tile.append(size // parts)
    return tuple(tile)


def check_map(m: Any, ndim: int, naxes: int, who: str | Callable[[], str]) -> None:
    """Raise ``TilingError`` (naming ``who``, or what ``who()`` says: written only for an
    error) unless ``m`` maps dims of an ``ndim``-d tensor to distinct axes of a grid with
    ``naxes`` axes."""
    def named() -> str:
        return who() if callable(who) else who

    if not isinstance(m, Mapping):
        raise TilingError(f"{named()}: a map must be a dict tensor dim -> grid axis")
    for d, a in m.items():
        if not isinstance(d, int) or not 0 <= d < ndim:
            raise TilingError(f"{named()}: {d!r} is not a dim of a {ndim}-d tensor")
        if not isinstance(a, int) or not 0 <= a < naxes:
            raise TilingError(f"{named()}: grid axis {a!r} does not exist (grid has {naxes} "
                              "axes)")
    axes = list(m.values())
    for a in set(axes):
        if axes.count(a) > 1:
            dims = [d for d, x in m.items() if x == a]
            raise TilingError(f"{named()}: grid axis {axis_name(a)} used twice (dims {dims})")


Kernel = PredefinedKernel | CustomKernel


def is_elementwise(node: Node) -> bool:
    """Whether a block op may sit in a thread chain."""
    return node.op in ELEMENTWISE


class KernelGraph(Protocol):
    """What the interpreter, the facts and the printer read of a ``MuGraph`` (``program.py``
    defines the class; these modules sit below it and take any object of this shape)."""

    name: str
    inputs: dict[str, Node]
    kernels: list[Kernel]
    output_tensors: dict[str, str]

    @property
    def tensors(self) -> dict[str, TensorSpec]: ...

    def validate(self) -> KernelGraph: ...

