"""MuGraph validation: each kernel checked against the device tensors defined before it.

``MuGraph.validate`` calls ``validate_kernel`` for every kernel in order; errors
are ``MuGraphError``s naming the kernel, the tensor and the shapes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..frontend.graph import Graph
from ..ir.check import check
from ..ir.errors import ShapeError
from ..ir.node import Node, Op, fmt_shape
from .kernels import (
    BlockOutput,
    CustomKernel,
    MuGraphError,
    PredefinedKernel,
    TensorSpec,
    TilingError,
    axis_name,
    check_map,
    check_read,
    fmt_map,
    is_elementwise,
    tile_shape,
)


def validate_kernel(k, known: Mapping[str, TensorSpec]) -> None:
    """Check kernel ``k`` (predefined or custom) against the device tensors ``known``."""
    if isinstance(k, CustomKernel):
        validate_custom(k, known)
    else:
        validate_predefined(k, known)


def validate_predefined(k: PredefinedKernel, known: Mapping[str, TensorSpec]) -> None:
    """Check a predefined kernel's op and operands against the device tensors ``known``."""
    n, who = k.node, f"kernel {k.name!r} ({k.node.op.name.lower()})"
    if not isinstance(n, Node) or n.op in (Op.INPUT, Op.CONST):
        raise MuGraphError(f"{who}: a predefined kernel must be one op over device tensors")
    for s in n.srcs:
        if s.op is Op.CONST:
            continue
        if s.op is not Op.INPUT:
            raise MuGraphError(f"{who}: operand {s.describe()} is not a device tensor; a "
                               "predefined kernel runs exactly one op")
        check_read(k.name, s.arg, known)
        spec = known[s.arg]
        if (spec.shape, spec.dtype) != (s.shape, s.dtype):
            raise ShapeError(f"{who}: operand {s.arg!r} is {s.dtype}{fmt_shape(s.shape)} but "
                             f"tensor {s.arg!r} is {spec.dtype}{fmt_shape(spec.shape)}")
    frag = Graph(f"{k.name}")
    frag.inputs = {s.arg: s for s in n.srcs if s.op is Op.INPUT}
    frag.outputs = {k.output: n}
    try:
        check(frag)
    except ShapeError as exc:
        raise ShapeError(f"{who}: {exc}") from None


# -- validation of a custom kernel ----------------------------------------------------------


def _check_stage(k: CustomKernel, stage: str) -> None:
    graph = k.stage(stage)
    if not graph.outputs:
        return
    try:
        check(graph)
    except ShapeError as exc:
        raise ShapeError(f"kernel {k.name!r}, {stage} stage: {exc}") from None
    for node in graph.nodes():
        if node.op is Op.MATMUL and min(len(s.shape) for s in node.srcs) < 2:
            raise TilingError(f"kernel {k.name!r}, {stage} stage: {node.describe()} of "
                              f"{', '.join(fmt_shape(s.shape) for s in node.srcs)}: block "
                              "matmuls need tiles of at least 2 dims")


def _check_leaf(k: CustomKernel, stage: str, name: str, want: tuple) -> None:
    node = k.stage(stage).inputs[name]
    if (node.shape, node.dtype) != want:
        raise TilingError(f"kernel {k.name!r}: {stage} tile {name!r} is declared "
                          f"{node.dtype}{fmt_shape(node.shape)} but its source gives "
                          f"{want[1]}{fmt_shape(want[0])}")


MAX_BLOCKS = 1 << 24  # blocks per custom kernel (CUDA allows more; no useful tiling needs them)
MAX_FORLOOP = 1 << 16  # forloop iterations per custom kernel


def validate_custom(k: CustomKernel, known: Mapping[str, TensorSpec]) -> None:
    """Check a custom kernel against the device tensors ``known`` before it."""
    who = f"kernel {k.name!r}"
    if not (1 <= len(k.grid) <= 3 and all(isinstance(g, int) and g >= 1 for g in k.grid)):
        raise TilingError(f"{who}: grid {k.grid!r} must be 1 to 3 positive ints")
    if not isinstance(k.forloop, int) or k.forloop < 1:
        raise TilingError(f"{who}: forloop range {k.forloop!r} must be a positive int")
    blocks = math.prod(k.grid)
    if blocks > MAX_BLOCKS or k.forloop > MAX_FORLOOP:
        raise TilingError(f"{who}: grid {k.grid!r} ({blocks} blocks) and forloop range "
                          f"{k.forloop} must stay within {MAX_BLOCKS} blocks and {MAX_FORLOOP} "
                          "iterations (the interpreter and the GPU both run every one)")
    tiles = {}
    for name, bi in k.inputs.items():
        check_read(k.name, bi.tensor, known)
        tiles[name] = (tile_shape(k, bi, known[bi.tensor]), known[bi.tensor].dtype)
        if name in k.loop.inputs:
            _check_leaf(k, "loop", name, tiles[name])
    runs = k.running_inputs()
    for name in k.loop.inputs:
        if name not in k.inputs and name not in runs:
            raise MuGraphError(f"{who}: loop tile {name!r} is not a block input")
    if len(set(k.accumulators)) != len(k.accumulators):
        raise MuGraphError(f"{who}: accumulator declared twice in {k.accumulators}")
    if not set(k.maxima) <= set(k.accumulators):
        raise MuGraphError(f"{who}: max accumulators {k.maxima} are not all accumulators")
    _validate_running(k, runs)
    loop_outs = set(k.accumulators) | {t for t, o in k.outputs.items() if o.stage == "loop"}
    post_outs = {t for t, o in k.outputs.items() if o.stage == "post"}
    if set(k.loop.outputs) != loop_outs or set(k.post.outputs) != post_outs:
        raise MuGraphError(f"{who}: stage outputs {sorted(k.loop.outputs)} (loop) and "
                           f"{sorted(k.post.outputs)} (post) do not match the accumulators "
                           f"{k.accumulators} and block outputs {sorted(k.outputs)}")
    _check_stage(k, "loop")
    for name in k.post.inputs:
        if name in k.accumulators:
            node = k.loop.outputs[name]
            _check_leaf(k, "post", name, (node.shape, node.dtype))
        elif name in k.inputs and k.inputs[name].fmap is None:
            _check_leaf(k, "post", name, tiles[name])
        else:
            raise MuGraphError(f"{who}: post tile {name!r} is neither an accumulator nor a "
                               "block input without fmap")
    _check_stage(k, "post")
    if not k.outputs:
        raise MuGraphError(f"{who} writes no tensor")
    for t, bo in k.outputs.items():
        _validate_output(k, t, bo)
    for stage, chain in k.threads:
        _validate_chain(k, stage, chain)
    if k.source is not None:
        _validate_source(k, known)


def _validate_running(k: CustomKernel, runs: Mapping[str, str]) -> None:
    """A running maximum: its own loop value must not read a running maximum (it is known
    before the rest of the iteration), and it must broadcast to what it rescales."""
    who = f"kernel {k.name!r}"
    for run, a in runs.items():
        node = k.loop.outputs[a]
        _check_leaf(k, "loop", run, (node.shape, node.dtype))
        ids = {id(k.loop.inputs[r]) for r in runs}
        if any(id(n) in ids for n in _ancestors(node)):
            raise MuGraphError(f"{who}: max accumulator {a!r} reads a running maximum; its "
                               "value must come from the tiles alone")
    validate_running_outputs(k)
    for acc, m in k.rescaled().items():
        shape, mshape = k.loop.outputs[acc].shape, k.loop.outputs[m].shape
        if len(mshape) > len(shape) or any(
                x not in (1, y) for x, y in zip(mshape[::-1], shape[::-1])):
            raise TilingError(f"{who}: running maximum {m!r} {fmt_shape(mshape)} does not "
                              f"broadcast to accumulator {acc!r} {fmt_shape(shape)}, which it "
                              "rescales")


def validate_running_outputs(k: CustomKernel) -> None:
    """A tile written during the loop (a loop-stage output) must not read a running
    maximum: it would see the maximum so far, not the final one (``TilingError``)."""
    ids = {id(k.loop.inputs[r]): a for r, a in k.running_inputs().items()}
    if not ids:
        return
    for t, bo in k.outputs.items():
        if bo.stage == "loop" and t not in k.accumulators:
            read = next((ids[id(n)] for n in _ancestors(k.loop.outputs[t]) if id(n) in ids),
                        None)
            if read is not None:
                raise TilingError(f"kernel {k.name!r}: loop-stage output {t!r} reads the "
                                  f"running maximum {read!r}: a tile written during the loop "
                                  "would see the maximum so far, not the final one")


def _ancestors(node: Node) -> list[Node]:
    from ..ir.node import toposort

    return toposort([node])


def _validate_output(k: CustomKernel, t: str, bo: BlockOutput) -> None:
    node = k.output_node(t)
    who = f"kernel {k.name!r}: output {t!r} (tile {fmt_shape(node.shape)})"
    if bo.stage not in ("loop", "post"):
        raise MuGraphError(f"{who}: stage {bo.stage!r} is not 'loop' or 'post'")
    check_map(bo.omap, len(node.shape), len(k.grid), f"{who}: omap {fmt_map(bo.omap)}")
    if bo.fmap is not None:
        if bo.stage != "loop":
            raise TilingError(f"{who}: only a loop-stage output can have an fmap")
        if not isinstance(bo.fmap, int) or not 0 <= bo.fmap < len(node.shape) \
                or bo.fmap in bo.omap:
            raise TilingError(f"{who}: fmap {bo.fmap!r} is not a free dim of the tile")
    for axis, size in enumerate(k.grid):
        if size > 1 and axis not in bo.omap.values():
            raise TilingError(f"{who}: grid axis {axis_name(axis)} (size {size}) is not in the "
                              f"omap {fmt_map(bo.omap)}, so {size} blocks would write the same "
                              "elements")


def _validate_chain(k: CustomKernel, stage: str, chain: tuple[Node, ...]) -> None:
    who = f"kernel {k.name!r}: thread chain in the {stage} stage"
    if stage not in ("loop", "post"):
        raise MuGraphError(f"{who}: unknown stage")
    ids = {id(n) for n in k.stage(stage).nodes()}
    for i, node in enumerate(chain):
        if id(node) not in ids or not is_elementwise(node):
            raise MuGraphError(f"{who}: {node.describe()} is not an elementwise op of the stage")
        if i and all(s is not chain[i - 1] for s in node.srcs):
            raise MuGraphError(f"{who}: {node.describe()} does not consume "
                               f"{chain[i - 1].describe()}")


def _validate_source(k: CustomKernel, known: Mapping[str, TensorSpec]) -> None:
    who = f"kernel {k.name!r}: source {k.source.name!r}"
    check(k.source)
    for name, node in k.source.inputs.items():
        if name not in k.reads():
            raise MuGraphError(f"{who} reads {name!r}, which the kernel does not read")
        spec = known[name]
        if (node.shape, node.dtype) != (spec.shape, spec.dtype):
            raise ShapeError(f"{who}: input {name!r} is {node.dtype}{fmt_shape(node.shape)}, "
                             f"the tensor is {spec.dtype}{fmt_shape(spec.shape)}")
    specs = k.output_specs()
    if set(k.source.outputs) != set(specs):
        raise MuGraphError(f"{who} computes {sorted(k.source.outputs)} but the kernel writes "
                           f"{sorted(specs)}")
    for t, node in k.source.outputs.items():
        if node.shape != specs[t].shape:
            raise ShapeError(f"{who}: output {t!r} is {fmt_shape(node.shape)} but the kernel "
                             f"writes {fmt_shape(specs[t].shape)}")
