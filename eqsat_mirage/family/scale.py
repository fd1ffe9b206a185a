"""One MuGraph for every size of a family: which grids and loops follow the size.

The search plans the padded program at one padded size Lp0. ``scaling`` finds how
that plan serves any padded size Lp: tile shapes stay, and every grid axis or loop
range that cuts a dynamic dim grows with it (a dim cut by both, FlashDecoding's
split, grows its grid: more parts of the same length). A plan that reads a dynamic
dim whole (its tile would grow) does not scale and is refused. ``Scaling.at(L)``
builds the MuGraph for length L at Lp = L rounded up to the plan's granule, its
length masks at ``L - 1``; ``FamilyMember`` is that MuGraph seen at the real sizes
(inputs zero-padded, outputs cut to L), which is what the verifier compares with the
family's program at L.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..frontend.family import remake
from ..ir.dims import DynamicShapeError
from ..ir.node import Node, Op, make
from ..mugraph.kernels import CustomKernel, PredefinedKernel, tile_shape
from ..mugraph.program import MuGraph


class NotScalableError(DynamicShapeError):
    """A plan whose tiles would change with the size (it reads a dynamic dim whole)."""


def is_length_mask(node: Node, lp: int) -> bool:
    """Whether ``node`` is a family's length mask at padded size ``lp``: CAUSAL(1, lp, *)."""
    return node.op is Op.CAUSAL and tuple(node.arg[:2]) == (1, lp)


@dataclass
class Scaling:
    """How plan ``mg`` (at padded size ``lp0`` of size ``dim``) serves every padded size.

    ``grid``: kernel -> grid axes that grow; ``loop``: kernels whose loop range grows;
    ``tensors``: tensor -> axes that grow (equal to Lp for inputs and outputs, whose real
    extent is L); ``granule``: padded sizes are its multiples.
    """

    mg: MuGraph
    dim: str
    lp0: int
    granule: int
    grid: dict[str, set[int]] = field(default_factory=dict)
    loop: set[str] = field(default_factory=set)
    tensors: dict[str, set[int]] = field(default_factory=dict)

    def padded(self, length: int) -> int:
        """The padded size serving ``length``: rounded up to the granule."""
        return -(-max(int(length), 1) // self.granule) * self.granule

    def at(self, length: int) -> MuGraph:
        """The plan for ``length``: grids, loops and tensors at its padded size, length masks
        at ``length - 1``."""
        lp = self.padded(length)
        mg = copy.deepcopy(self.mg)
        for name, node in mg.inputs.items():
            shape = tuple(lp if a in self.tensors.get(name, ()) else s
                          for a, s in enumerate(node.shape))
            mg.inputs[name] = Node(Op.INPUT, (), name, shape, node.dtype, node.loc)
        for k in mg.kernels:
            if isinstance(k, PredefinedKernel):
                specs = mg.tensors
                k.node = _remake(k.node, specs, self.lp0, lp, length)
                continue
            k.grid = tuple(g * lp // self.lp0 if a in self.grid.get(k.name, ()) else g
                           for a, g in enumerate(k.grid))
            if k.name in self.loop:
                k.forloop = k.forloop * lp // self.lp0
            k.source = None  # the kernel-level fragment is the hint's; the tiling is what runs
        return mg.validate()


def _remake(node: Node, specs, lp0: int, lp: int, length: int,
            memo: dict | None = None) -> Node:
    """``node`` (a predefined kernel's op) at padded size ``lp``: operands at their new
    shapes (one node per operand tensor), the length mask at ``length - 1``."""
    memo = {} if memo is None else memo
    if id(node) in memo:
        return memo[id(node)]
    if node.op is Op.INPUT:
        out = Node(Op.INPUT, (), node.arg, specs[node.arg].shape, node.dtype, node.loc)
    elif node.op is Op.CONST:
        out = node
    elif is_length_mask(node, lp0):
        out = make(Op.CAUSAL, (), (1, lp, length - 1))
    else:
        srcs = tuple(_remake(s, specs, lp0, lp, length, memo) for s in node.srcs)
        out = remake(node, srcs, {"size": lp0}, {"size": lp})
    memo[id(node)] = out
    return out


def _custom(k: CustomKernel, dyn: Mapping[str, set[int]]) -> tuple[set[int], bool]:
    """The grid axes and whether the loop of ``k`` grow with the size."""
    axes, loop = set(), False
    for bi in k.inputs.values():
        for d in dyn.get(bi.tensor, ()):
            if d in bi.imap:
                axes.add(bi.imap[d])
            elif d == bi.fmap:
                loop = True
            else:
                raise NotScalableError(
                    f"kernel {k.name!r} reads dim {d} of {bi.tensor!r} whole (block input "
                    f"{bi.name!r}): its tile would grow with the dynamic size")
    for bi in k.inputs.values():
        for d in range(len(k.loop.inputs[bi.name].shape)):
            grows = int(d in dyn.get(bi.tensor, ())) - int(d in bi.imap and bi.imap[d] in axes) \
                - int(d == bi.fmap and loop)
            if grows:
                raise NotScalableError(
                    f"kernel {k.name!r}: block input {bi.name!r} ({bi.tensor!r} dim {d}) would "
                    f"{'grow' if grows > 0 else 'shrink'} with the dynamic size under this "
                    "grid and loop")
    return axes, loop


def scaling(mg: MuGraph, dynamic: Mapping[str, Mapping[int, str]], dim: str,
            lp0: int) -> Scaling:
    """How ``mg``, planned at padded size ``lp0`` of ``dim``, serves other sizes; a
    ``NotScalableError`` names the kernel whose tiles would change.

    ``dynamic`` maps input names to {axis: size name} (the family's inputs)."""
    mg.validate()
    dyn: dict[str, set[int]] = {n: {a for a, d in axes.items() if d == dim}
                                for n, axes in dynamic.items()}
    out = Scaling(mg, dim, lp0, lp0)
    sizes: list[int] = [lp0]
    probe = copy.deepcopy(mg)  # the same plan at 2 * lp0: which tensor dims double
    for name, node in probe.inputs.items():
        shape = tuple(2 * s if a in dyn.get(name, ()) else s for a, s in enumerate(node.shape))
        probe.inputs[name] = Node(Op.INPUT, (), name, shape, node.dtype)
    for k, k2 in zip(mg.kernels, probe.kernels):
        if isinstance(k, PredefinedKernel):
            k2.node = _remake(k2.node, probe.tensors, lp0, 2 * lp0, 2 * lp0)
        else:
            axes, loop = _custom(k, dyn)
            out.grid[k.name] = axes
            if loop:
                out.loop.add(k.name)
                sizes.append(k.forloop)
            sizes += [k.grid[a] for a in axes]
            k2.grid = tuple(2 * g if a in axes else g for a, g in enumerate(k.grid))
            k2.forloop = 2 * k.forloop if loop else k.forloop
            k2.source = None
            specs2 = probe.tensors
            for bi in k2.inputs.values():
                tile_shape(k2, bi, specs2[bi.tensor])  # the same tiles, or a TilingError
        small, big = mg.tensors, probe.tensors
        for t in k.output_specs():
            a, b = small[t].shape, big[t].shape
            if any(y not in (x, 2 * x) for x, y in zip(a, b)):
                raise NotScalableError(f"kernel {k.name!r}: tensor {t!r} does not grow in "
                                       "proportion to the dynamic size")
            dyn[t] = {i for i, (x, y) in enumerate(zip(a, b)) if y == 2 * x}
            sizes += [a[i] for i in dyn[t]]
    out.tensors = {t: axes for t, axes in dyn.items() if axes}
    out.granule = math.lcm(*(lp0 // math.gcd(lp0, s) for s in sizes))
    return out


class FamilyMember:
    """A family's plan at length L seen at the real sizes: what ``em.verify`` compares with
    the family's program at L (inputs zero-padded to the plan's size, outputs cut to L)."""

    def __init__(self, scaled: Scaling, length: int, real_inputs: Mapping[str, Node],
                 real_outputs: Mapping[str, Node]) -> None:
        self.scaled, self.length = scaled, int(length)
        self.program = scaled.at(length)
        self.name = f"{self.program.name}@{scaled.dim}={length}"
        self.inputs = dict(real_inputs)
        self.outputs = dict(real_outputs)

    def _pad(self, name: str, x):
        want = self.program.inputs[name].shape
        if np.shape(x) == want:
            return x
        return np.pad(x, [(0, w - s) for s, w in zip(np.shape(x), want)])

    def _cut(self, name: str, y):
        return np.asarray(y)[tuple(slice(0, s) for s in self.outputs[name].shape)]

    # the program protocol of em.verify / em.evaluate
    @property
    def kernels(self) -> list:
        """The kernels of the plan at this length."""
        return self.program.kernels

    @property
    def tensors(self) -> dict:
        """The device tensors of the plan at this length."""
        return self.program.tensors

    def validate(self):
        return self.program.validate()

    def check_lax(self, what: str = "program") -> None:
        self.program.check_lax(what)

    def footprint(self):
        return self.program.footprint()

    def degrees(self):
        return self.program.degrees()

    def bit_degrees(self) -> dict:
        """The plan's bit degree per output (``verifier.bound.bit_degree``): the plan's own."""
        return self.program.bit_degrees()

    def evaluate(self, inputs, dtype=None, rounded=False) -> dict:
        padded = {n: self._pad(n, np.asarray(v)) for n, v in inputs.items()}
        out = self.program.evaluate(padded, dtype=dtype, rounded=rounded)
        return {n: self._cut(n, v) for n, v in out.items()}

    def evaluate_field(self, ctx) -> dict:
        inner = copy.copy(ctx)
        inner.inputs = {n: tuple(None if part is None else self._pad(n, part) for part in v)
                        for n, v in ctx.inputs.items()}
        out = self.program.evaluate_field(inner)
        return {n: tuple(None if part is None else self._cut(n, np.broadcast_to(
            part, self.program.outputs[n].shape)) for part in v) for n, v in out.items()}
