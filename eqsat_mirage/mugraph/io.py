"""MuGraph forms: the readable listing and the JSON round trip.

JSON: ``{"format": "eqsat-mirage.mugraph", "version": 1, "name", "inputs",
"kernels", "outputs"}``; every graph fragment (a predefined kernel's op, a
custom kernel's loop, post and source graphs) is a node list in operand-first
order, and maps are ``[dim, grid axis]`` pairs. Loading re-infers every shape.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..frontend.graph import Graph
from ..ir.node import Node, Op, fmt_shape, make
from ..ir.printing import op_attrs, short_dtype
from .kernels import (
    BlockInput,
    BlockOutput,
    CustomKernel,
    KernelGraph,
    MuGraphError,
    PredefinedKernel,
    TensorSpec,
    axis_name,
    check_name,
    fmt_map,
)

# -- printing -------------------------------------------------------------------------------


def _fmt_stage(graph: Graph, names: dict[int, str], counter: list[int], indent: str) -> list[str]:
    lines = []
    for node in graph.nodes():
        if node.op is Op.INPUT:
            names[id(node)] = node.arg
        elif node.op is Op.CONST:
            names[id(node)] = repr(node.arg)
        else:
            names[id(node)] = f"%{counter[0]}"
            counter[0] += 1
            rhs = f"{node.op.name.lower()}{op_attrs(node)} " + ", ".join(names[id(s)]
                                                                   for s in node.srcs)
            lines.append(f"{indent}{names[id(node)]} = {rhs:<36} : "
                         f"{short_dtype(node.dtype)}{list(node.shape)}")
    return lines


def _fmt_custom(k: CustomKernel, specs: Mapping[str, TensorSpec]) -> list[str]:
    grid = ", ".join(f"{axis_name(i)}={g}" for i, g in enumerate(k.grid))
    blocks = 1
    for g in k.grid:
        blocks *= g
    warps = f" warps={k.num_warps}" if k.num_warps else ""
    lines = [f"  kernel {k.name}: custom grid=({grid}) [{blocks} blocks] forloop={k.forloop}"
             f"{warps}"]
    for bi in k.inputs.values():
        node, spec = k.loop.inputs[bi.name], specs.get(bi.tensor)
        src = f"{bi.tensor}{list(spec.shape)}" if spec else bi.tensor
        lines.append(f"    in  {bi.name}: {short_dtype(node.dtype)}{list(node.shape)} <- {src} "
                     f"imap={fmt_map(bi.imap)} fmap={bi.fmap}")
    names: dict[int, str] = {}
    counter = [0]
    lines.append(f"    loop (x{k.forloop}):")
    lines += _fmt_stage(k.loop, names, counter, "      ")
    scaled = k.rescaled()
    for a in k.accumulators:
        v = names[id(k.loop.outputs[a])]
        lines.append(f"      acc {a} = max({a}, {v})" if a in k.maxima else
                     f"      acc {a} = {a} * exp({scaled[a]}_old - {scaled[a]}_run) + {v}"
                     if a in scaled else f"      acc {a} += {v}")
    lines.append("    post:")
    lines += _fmt_stage(k.post, names, counter, "      ")
    for t, bo in k.outputs.items():
        node, spec = k.output_node(t), k.output_specs()[t]
        fm = f" fmap={bo.fmap}" if bo.fmap is not None else ""
        lines.append(f"    out {t}{list(spec.shape)}" + (f" {short_dtype(spec.dtype)}" if bo.dtype
                                                    else "") + f" <- {bo.stage} "
                     f"{names[id(node)]} {short_dtype(node.dtype)}{list(node.shape)} "
                     f"omap={fmt_map(bo.omap)}{fm}")
    for stage, chain in k.threads:
        lines.append(f"    thread ({stage}): " + " -> ".join(names.get(id(n), "?")
                                                          for n in chain))
    if k.source is not None:
        lines.append(f"    source: {k.source.name}")
    return lines


def format_mugraph(mg: KernelGraph, name: str | None = None) -> str:
    """A readable listing: kernels, grids, loops, maps, tile shapes, accumulators, outputs
    (``name``: shown for the MuGraph's, e.g. in a generated module's comment)."""
    ins = ", ".join(f"{n}: {short_dtype(v.dtype)}{list(v.shape)}" for n, v in mg.inputs.items())
    lines = [f"mugraph {mg.name if name is None else name}({ins})"]
    specs = mg.tensors
    # tensors the host holds: read by a library kernel, or an output (a causal mask read only
    # by custom kernels is computed from positions inside them, never written)
    held = {s.arg for k in mg.kernels if isinstance(k, PredefinedKernel)
            for s in k.node.srcs if s.op is Op.INPUT} | set(mg.output_tensors.values())
    for k in mg.kernels:
        if isinstance(k, PredefinedKernel):
            n = k.node
            args = ", ".join(s.arg if s.op is Op.INPUT else repr(s.arg) for s in n.srcs)
            where = ("  (computed from positions in the kernels that read it; not written)"
                     if n.op is Op.CAUSAL and k.output not in held else "")
            lines.append(f"  kernel {k.name}: {k.output} = {n.op.name.lower()}{op_attrs(n)} {args}"
                         f"  : {short_dtype(n.dtype)}{list(n.shape)}{where}")
        else:
            lines += _fmt_custom(k, specs)
    for name, t in mg.output_tensors.items():
        lines.append(f"  output {name} <- {t}")
    return "\n".join(lines)


# -- JSON -----------------------------------------------------------------------------------

FORMAT = "eqsat-mirage.mugraph"
VERSION = 1  # the serialized form's version: another is refused


def _arg_json(node: Node) -> Any:
    if node.op in (Op.SUM, Op.MEAN, Op.MAX):
        return [list(node.arg[0]), bool(node.arg[1])]
    if node.op in (Op.TRANSPOSE, Op.RESHAPE, Op.SLICE, Op.CAUSAL):
        return list(node.arg)
    return node.arg


def _arg_load(op: Op, arg: Any) -> Any:
    if op in (Op.SUM, Op.MEAN, Op.MAX):
        return tuple(int(a) for a in arg[0]), bool(arg[1])
    if op in (Op.TRANSPOSE, Op.RESHAPE):
        return tuple(int(a) for a in arg)
    if op is Op.CONST:
        return float(arg)
    if op in (Op.CAUSAL, Op.SLICE):
        return tuple(int(a) for a in arg)
    if op is Op.CAST:
        return str(arg)
    return int(arg) if op in (Op.CONCAT, Op.BITAND, Op.SHR) else arg


def graph_to_dict(graph: Graph) -> dict:
    """A Graph (fragment) as JSON-compatible data."""
    nodes = graph.nodes()
    index = {id(n): i for i, n in enumerate(nodes)}
    return {"name": graph.name,
            "inputs": [{"name": n, "shape": list(v.shape), "dtype": v.dtype}
                       for n, v in graph.inputs.items()],
            "nodes": [{"op": n.op.name.lower(), "srcs": [index[id(s)] for s in n.srcs],
                       "arg": _arg_json(n), "shape": list(n.shape), "dtype": n.dtype}
                      for n in nodes],
            "outputs": {name: index[id(n)] for name, n in graph.outputs.items()}}


def graph_from_dict(data: Mapping) -> Graph:
    """Rebuild a Graph from ``graph_to_dict`` output, re-inferring every shape."""
    return _graph_and_nodes(data)[0]


def _graph_and_nodes(data: Mapping) -> tuple[Graph, list[Node]]:
    """The Graph of ``graph_to_dict`` output and its nodes in the order they were written
    (what node indices such as a thread chain's refer to: the graph's own ``nodes()``
    order follows its outputs' order, which a JSON store with sorted keys changes)."""
    g = Graph(data["name"])
    for inp in data["inputs"]:
        g.input(inp["name"], inp["shape"], inp["dtype"])
    nodes: list[Node] = []
    for i, d in enumerate(data["nodes"]):
        op, shape = Op[d["op"].upper()], tuple(d["shape"])
        if op is Op.INPUT:
            node = g.inputs[d["arg"]]
        elif op is Op.CONST:
            value = float(d["arg"])
            if math.isnan(value):  # inf is a mask's fill value; NaN is no program's constant
                raise MuGraphError(f"graph {g.name!r}: node {i} (const) is NaN")
            node = Node(Op.CONST, (), value, (), d["dtype"])
        else:
            node = make(op, tuple(nodes[s] for s in d["srcs"]), _arg_load(op, d["arg"]))
        if (node.shape, node.dtype) != (shape, d["dtype"]):
            raise MuGraphError(f"graph {g.name!r}: node {i} ({d['op']}) is recorded as "
                               f"{d['dtype']}{fmt_shape(shape)} but its operands give "
                               f"{node.dtype}{fmt_shape(node.shape)}")
        nodes.append(node)
    g.outputs = {check_name(name, f"graph {g.name!r}: output"): nodes[i]
                 for name, i in data["outputs"].items()}
    return g, nodes


def _map_json(m: Mapping[int, int]) -> list[list[int]]:
    return [[d, a] for d, a in sorted(m.items())]


def to_dict(mg: KernelGraph) -> dict:
    """A MuGraph as JSON-compatible data (maps as [dim, axis] pairs)."""
    kernels = []
    for k in mg.kernels:
        if isinstance(k, PredefinedKernel):
            frag = Graph(k.name)
            frag.inputs = {s.arg: s for s in k.node.srcs if s.op is Op.INPUT}
            frag.outputs = {k.output: k.node}
            kernels.append({"kind": "predefined", "name": k.name, "output": k.output,
                            "graph": graph_to_dict(frag)})
            continue
        pos = {st: {id(n): i for i, n in enumerate(k.stage(st).nodes())} for st in ("loop", "post")}
        kernels.append({
            "kind": "custom", "name": k.name, "grid": list(k.grid), "forloop": k.forloop,
            "inputs": [{"name": b.name, "tensor": b.tensor, "imap": _map_json(b.imap),
                        "fmap": b.fmap} for b in k.inputs.values()],
            "loop": graph_to_dict(k.loop), "post": graph_to_dict(k.post),
            "accumulators": list(k.accumulators), "maxima": list(k.maxima),
            "outputs": [{"tensor": t, "stage": o.stage, "omap": _map_json(o.omap),
                         "fmap": o.fmap, **({"dtype": o.dtype} if o.dtype else {})}
                        for t, o in k.outputs.items()],
            "threads": [{"stage": st, "nodes": [pos[st].get(id(n), -1) for n in chain]}
                        for st, chain in k.threads],
            "source": graph_to_dict(k.source) if k.source is not None else None,
            **({"num_warps": k.num_warps} if k.num_warps else {})})
    return {"format": FORMAT, "version": VERSION, "name": mg.name,
            "inputs": [{"name": n, "shape": list(v.shape), "dtype": v.dtype}
                       for n, v in mg.inputs.items()],
            "kernels": kernels, "outputs": dict(mg.output_tensors)}


def custom_kernel_from_dict(d: Mapping) -> CustomKernel:
    """A custom kernel from its ``to_dict`` form (the caller sets its owner MuGraph)."""
    k = CustomKernel(tuple(d["grid"]), d["forloop"], d["name"],
                     graph_from_dict(d["source"]) if d.get("source") else None)
    for b in d["inputs"]:
        k.inputs[b["name"]] = BlockInput(b["name"], b["tensor"], {int(x): int(a) for x, a in
                                                                  b["imap"]}, b["fmap"])
    (k.loop, loop_nodes), (k.post, post_nodes) = (_graph_and_nodes(d[st])
                                                  for st in ("loop", "post"))
    k.accumulators = list(d["accumulators"])
    k.maxima = [str(a) for a in d.get("maxima", [])]
    if d.get("num_warps") is not None:
        if d["num_warps"] not in (1, 2, 4, 8, 16, 32):
            raise MuGraphError(f"kernel {d['name']!r}: num_warps must be a power of two "
                               f"from 1 to 32, got {d['num_warps']!r}")
        k.num_warps = int(d["num_warps"])
    for o in d["outputs"]:
        k.outputs[o["tensor"]] = BlockOutput(o["tensor"], o["stage"],
                                             {int(x): int(a) for x, a in o["omap"]}, o["fmap"],
                                             o.get("dtype"))
    for th in d.get("threads", []):
        nodes = {"loop": loop_nodes, "post": post_nodes}.get(th["stage"], [])
        k.threads.append((th["stage"], tuple(nodes[i] for i in th["nodes"])))
    return k
