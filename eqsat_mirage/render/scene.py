"""What ``render`` draws, independent of the backend: a scene of nodes, edges and clusters.

A ``Scene`` has one panel per program (two with ``source=``: the input program
left, the MuGraph right). Nodes carry a ``kind`` that says where the value
lives, so every backend colours them the same way (``KINDS``):

- ``dram``: a device-memory tensor (program inputs and outputs, kernel outputs);
- ``smem``: a shared-memory tile (block inputs, forloop accumulators, post-loop
  tiles), as ``gpucost.smem_bytes`` counts them;
- ``reg``: a value kept in registers (loop-stage values, the interior of a
  thread graph), as the cost model counts them;
- ``op``: a kernel-level op, or a predefined (library) kernel of a MuGraph;
- ``io``: a block output, written back to device memory by its ``omap``.

Clusters (``CLUSTERS``) group nodes: a panel, a custom kernel (its title gives
the grid, the block count, the loop range and the predicted time), the forloop
body, and a thread graph (an elementwise chain fused in registers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..cost.gpucost import MuGraphCost
from ..frontend.graph import Graph
from ..ir.node import Node, Op
from ..ir.printing import op_attrs, short_dtype
from ..mugraph.kernels import CustomKernel, PredefinedKernel, axis_name, fmt_map
from ..mugraph.program import MuGraph

# kind -> (legend text, fill colour, border colour)
KINDS = {
    "dram": ("device-memory (DRAM) tensor", "#cfe2f3", "#3d85c6"),
    "smem": ("shared-memory tile", "#fce5cd", "#e69138"),
    "reg": ("register value (loop stage / thread graph)", "#d9ead3", "#6aa84f"),
    "op": ("op / library kernel", "#eeeeee", "#666666"),
    "io": ("block output (write-back by omap)", "#ffffff", "#999999"),
}
# cluster kind -> (legend text, fill colour, border colour, dashed)
CLUSTERS = {
    "panel": ("", "#ffffff", "#bbbbbb", False),
    "kernel": ("custom kernel (block graph)", "#f7f7fb", "#674ea7", False),
    "loop": ("forloop body (runs F times)", "#fffbea", "#bf9000", False),
    "thread": ("thread graph (fused in registers)", "#eef7ea", "#6aa84f", True),
}


@dataclass
class SNode:
    """A node: its id, its text lines and its kind (a key of ``KINDS``)."""

    id: str
    lines: list[str]
    kind: str


@dataclass
class SEdge:
    """An edge between two node ids, with an optional label (a shape)."""

    src: str
    dst: str
    label: str = ""


@dataclass
class SCluster:
    """A group of nodes and sub-clusters with a title (kind: a key of ``CLUSTERS``)."""

    id: str
    title: list[str]
    kind: str
    items: list[SNode | SCluster] = field(default_factory=list)

    def nodes(self) -> list[SNode]:
        """Every node inside, sub-clusters included."""
        out: list[SNode] = []
        for it in self.items:
            out.extend(it.nodes() if isinstance(it, SCluster) else [it])
        return out

    def clusters_depth(self) -> int:
        """How deep clusters nest inside this one (0: no sub-clusters)."""
        return max((1 + it.clusters_depth() for it in self.items if isinstance(it, SCluster)),
                   default=0)

    def clusters(self) -> list[SCluster]:
        """This cluster and every sub-cluster."""
        out = [self]
        for it in self.items:
            if isinstance(it, SCluster):
                out.extend(it.clusters())
        return out


@dataclass
class Scene:
    """Panels side by side, the edges between their nodes, and a title."""

    title: str
    panels: list[SCluster]
    edges: list[SEdge]

    def kinds(self) -> tuple[list[str], list[str]]:
        """The node kinds and the cluster kinds (panels excluded) the scene uses."""
        nodes = {n.kind for p in self.panels for n in p.nodes()}
        clusters = {c.kind for p in self.panels for c in p.clusters()} - {"panel"}
        return [k for k in KINDS if k in nodes], [k for k in CLUSTERS if k in clusters]


def shape_text(node: Node) -> str:
    """``f16[2, 256, 64]``: dtype and shape of a node."""
    return f"{short_dtype(node.dtype)}{list(node.shape)}"


def op_text(node: Node) -> str:
    """An op with its argument and its constant operands, e.g. ``add 1e-06``."""
    consts = [f"{s.arg:g}" for s in node.srcs if s.op is Op.CONST]
    return f"{node.op.name.lower()}{op_attrs(node)}" + (" " + ", ".join(consts) if consts else "")


def fmt_us(us: float) -> str:
    """A predicted time: ``12.34 us`` or ``INFEASIBLE``."""
    return "INFEASIBLE" if math.isinf(us) else f"{us:.2f} us"


# -- a kernel-level Graph -----------------------------------------------------------------------


def graph_panel(graph: Graph, pid: str, costs: list[float] | None = None,
                note: str = "") -> tuple[SCluster, list[SEdge]]:
    """A panel for ``graph``: inputs and outputs as DRAM nodes, ops as boxes, shapes on edges.

    ``costs``: the predicted time of each op run as its own library kernel (op order).
    """
    ops = [n for n in graph.nodes() if n.op not in (Op.INPUT, Op.CONST)]
    title = [f"{graph.name}: input program, {len(ops)} op{'s' if len(ops) != 1 else ''}"]
    if note:
        title.append(note)
    panel = SCluster(pid, title, "panel")
    edges: list[SEdge] = []
    ids: dict[int, str] = {}
    for name, node in graph.inputs.items():
        ids[id(node)] = f"{pid}.in.{name}"
        panel.items.append(SNode(ids[id(node)], [f"{name} (input)", shape_text(node)], "dram"))
    for i, node in enumerate(ops):
        ids[id(node)] = f"{pid}.op{i}"
        lines = [f"%{i} = {op_text(node)}"]
        if costs is not None and i < len(costs):
            lines.append(fmt_us(costs[i]))
        panel.items.append(SNode(ids[id(node)], lines, "op"))
        for s in dict.fromkeys(s for s in node.srcs if s.op is not Op.CONST):
            edges.append(SEdge(ids[id(s)], ids[id(node)], shape_text(s)))
    for name, node in graph.outputs.items():
        nid = f"{pid}.out.{name}"
        panel.items.append(SNode(nid, [f"{name} (output)", shape_text(node)], "dram"))
        edges.append(SEdge(ids[id(node)], nid, shape_text(node)))
    return panel, edges


# -- a MuGraph ------------------------------------------------------------------------------------


def _tensor_lines(name: str, shape, dtype: str, role: str) -> list[str]:
    return [f"{name}{role}", f"{short_dtype(dtype)}{list(shape)}"]


def mugraph_panel(mg: MuGraph, pid: str, cost: MuGraphCost | None = None
                  ) -> tuple[SCluster, list[SEdge]]:
    """A panel for ``mg``: DRAM tensors, predefined kernels as boxes, custom kernels as clusters."""
    custom = sum(k.kind == "custom" for k in mg.kernels)
    n = len(mg.kernels)
    title = [f"{mg.name}: MuGraph, {n} kernel{'s' if n != 1 else ''} ({custom} custom)"]
    by_name = {k.name: k for k in cost.kernels} if cost is not None else {}
    if cost is not None:
        title.append(f"predicted {fmt_us(cost.total_us)} on {cost.target}")
    panel = SCluster(pid, title, "panel")
    edges: list[SEdge] = []
    specs = mg.tensors
    outs: dict[str, list[str]] = {}
    for name, t in mg.output_tensors.items():
        outs.setdefault(t, []).append(name)

    def tensor_node(t: str, role: str) -> None:
        spec = specs[t]
        role = role + (f" -> output {', '.join(n for n in outs[t] if n != t)}"
                       if t in outs and any(n != t for n in outs[t]) else
                       " (output)" if t in outs else "")
        panel.items.append(SNode(f"{pid}.t.{t}", _tensor_lines(t, spec.shape, spec.dtype, role),
                                 "dram"))

    for name in mg.inputs:
        tensor_node(name, " (input)")
    for k in mg.kernels:
        kc = by_name.get(k.name)
        if isinstance(k, PredefinedKernel):
            kid = f"{pid}.k.{k.name}"
            lines = [f"{k.name}: {op_text(k.node)}", "library kernel"]
            if kc is not None:
                lines.append(fmt_us(kc.time_us))
            panel.items.append(SNode(kid, lines, "op"))
            for t in k.reads():
                edges.append(SEdge(f"{pid}.t.{t}", kid))
            edges.append(SEdge(kid, f"{pid}.t.{k.output}"))
        else:
            cl, kedges = custom_cluster(k, f"{pid}.k.{k.name}", pid,
                                        kc.time_us if kc is not None else None)
            panel.items.append(cl)
            edges += kedges
        for t in k.output_specs():
            tensor_node(t, "")
    return panel, edges


def kernel_title(k: CustomKernel, time_us: float | None = None) -> list[str]:
    """``k0: custom kernel  12.34 us`` and ``grid=(x=2, y=32) [64 blocks]  forloop=4``."""
    grid = ", ".join(f"{axis_name(i)}={g}" for i, g in enumerate(k.grid))
    blocks = math.prod(k.grid)
    head = f"{k.name}: custom kernel" + (f"  {fmt_us(time_us)}" if time_us is not None else "")
    return [head, f"grid=({grid}) [{blocks} blocks]  forloop={k.forloop}"]


def custom_cluster(k: CustomKernel, kid: str, pid: str, time_us: float | None = None
                   ) -> tuple[SCluster, list[SEdge]]:
    """A custom kernel's block graph: block inputs, forloop, post-loop ops, outputs."""
    cl = SCluster(kid, kernel_title(k, time_us), "kernel")
    edges: list[SEdge] = []
    ids: dict[str, dict[int, str]] = {"loop": {}, "post": {}}
    for bi in k.inputs.values():
        node = k.loop.inputs[bi.name]
        nid = f"{kid}.in.{bi.name}"
        src = bi.name if bi.name == bi.tensor else f"{bi.name} <- {bi.tensor}"
        fmap = f" fmap={bi.fmap}" if bi.fmap is not None else ""
        cl.items.append(SNode(nid, [src, shape_text(node), f"imap={fmt_map(bi.imap)}{fmap}"],
                              "smem"))
        ids["loop"][id(node)] = nid
        if bi.name in k.post.inputs:
            ids["post"][id(k.post.inputs[bi.name])] = nid
        edges.append(SEdge(f"{pid}.t.{bi.tensor}", nid))
    counter = [0]
    loop_ops = [n for n in k.loop.nodes() if n.op not in (Op.INPUT, Op.CONST)]
    if loop_ops or k.accumulators:
        loop = SCluster(f"{kid}.loop", [f"forloop x{k.forloop}"], "loop")
        _stage_items(k, "loop", loop, ids["loop"], counter, edges, kid)
        for a in k.accumulators:
            value = k.loop.outputs[a]
            nid = f"{kid}.acc.{a}"
            loop.items.append(SNode(nid, [f"{a} += (sum over {k.forloop} iterations)",
                                          f"f32{list(value.shape)}"], "smem"))
            edges.append(SEdge(ids["loop"][id(value)], nid))
            ids["post"][id(k.post.inputs[a])] = nid
        _outputs(k, "loop", loop, ids["loop"], edges, kid, pid)
        cl.items.append(loop)
    _stage_items(k, "post", cl, ids["post"], counter, edges, kid)
    _outputs(k, "post", cl, ids["post"], edges, kid, pid)
    return cl, edges


def _stage_items(k: CustomKernel, stage: str, parent: SCluster, ids: dict[int, str],
                 counter: list[int], edges: list[SEdge], kid: str) -> None:
    """Add the ops of one stage to ``parent``, thread chains grouped in thread clusters."""
    graph = k.stage(stage)
    chains = [chain for st, chain in k.threads if st == stage]
    interior = {id(n) for chain in chains for n in chain[:-1]}
    chain_of = {id(n): i for i, chain in enumerate(chains) for n in chain}
    threads: dict[int, SCluster] = {}
    for node in graph.nodes():
        if node.op in (Op.INPUT, Op.CONST):
            continue
        nid = f"{kid}.{stage}{counter[0]}"
        in_regs = stage == "loop" or id(node) in interior or node.op is Op.RESHAPE
        sn = SNode(nid, [f"%{counter[0]} = {op_text(node)}", shape_text(node)],
                   "reg" if in_regs else "smem")
        counter[0] += 1
        ids[id(node)] = nid
        c = chain_of.get(id(node))
        if c is None:
            parent.items.append(sn)
        else:
            if c not in threads:
                threads[c] = SCluster(f"{kid}.{stage}.thread{c}", ["thread graph"], "thread")
                parent.items.append(threads[c])
            threads[c].items.append(sn)
        for s in dict.fromkeys(s for s in node.srcs if s.op is not Op.CONST):
            if id(s) in ids:
                edges.append(SEdge(ids[id(s)], nid))


def _outputs(k: CustomKernel, stage: str, parent: SCluster, ids: dict[int, str],
             edges: list[SEdge], kid: str, pid: str) -> None:
    for t, bo in k.outputs.items():
        if bo.stage != stage:
            continue
        nid = f"{kid}.out.{t}"
        fmap = f" fmap={bo.fmap}" if bo.fmap is not None else ""
        parent.items.append(SNode(nid, [f"write {t}", f"omap={fmt_map(bo.omap)}{fmap}"], "io"))
        src = ids.get(id(k.output_node(t)))
        if src is not None:
            edges.append(SEdge(src, nid))
        edges.append(SEdge(nid, f"{pid}.t.{t}"))
