"""Stitching: the programs chosen for each piece put back together as one MuGraph.

Each piece's program (a ``MuGraph``, or a kernel-level ``Graph``, taken one
kernel per op) reads the piece's inputs ``in0, in1, ...``. In the stitched
program those are the whole program's inputs, or the tensors earlier pieces
wrote; every other tensor and kernel of piece j is renamed with a ``p{j}_``
prefix (and a ``_1``, ``_2``... suffix where that would be a user's input name or another
tensor's: a user's names never collide with the stitched ones). The stitching works on
the plain-data form (``MuGraph.to_dict``), so nothing about a kernel is lost or re-derived,
and the result is validated.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

from ..frontend.graph import Graph
from ..ir.node import Node, Op
from ..mugraph.kernels import MuGraphError
from ..mugraph.program import MuGraph, from_dict, from_graph
from .pieces import Piece


def _rename_fragment(frag: dict, ren: Callable[[str], str]) -> None:
    """Rename the device tensors a graph fragment reads (its inputs) and writes (outputs)."""
    for inp in frag["inputs"]:
        inp["name"] = ren(inp["name"])
    for n in frag["nodes"]:
        if n["op"] == "input":
            n["arg"] = ren(n["arg"])
    frag["outputs"] = {ren(k): v for k, v in frag["outputs"].items()}


def _rename_kernel(d: dict, ren: Callable[[str], str], name: str) -> dict:
    """A copy of kernel data ``d`` named ``name`` with every device tensor renamed."""
    d = copy.deepcopy(d)
    d["name"] = name
    if d["kind"] == "predefined":
        d["output"] = ren(d["output"])
        _rename_fragment(d["graph"], ren)
        return d
    written = {o["tensor"] for o in d["outputs"]}
    for b in d["inputs"]:
        b["tensor"] = ren(b["tensor"])
    for o in d["outputs"]:
        o["tensor"] = ren(o["tensor"])
    for stage in ("loop", "post"):  # stage outputs: block outputs (tensors) and accumulators
        d[stage]["outputs"] = {ren(k) if k in written else k: v
                               for k, v in d[stage]["outputs"].items()}
    if d.get("source"):
        _rename_fragment(d["source"], ren)
    return d


def stitch(graph: Graph, pieces: Sequence[Piece], programs: Sequence[object],
           name: str | None = None) -> MuGraph:
    """One MuGraph running ``programs[j]`` for ``pieces[j]``, reading ``graph``'s inputs
    and writing its outputs."""
    data = {"format": "eqsat-mirage.mugraph", "version": 1, "name": name or f"{graph.name}_opt",
            "inputs": [{"name": n, "shape": list(v.shape), "dtype": v.dtype}
                       for n, v in graph.inputs.items()], "kernels": [], "outputs": {}}
    tensor_of: dict[int, str] = {id(n): n.arg for n in graph.inputs.values()}
    taken = set(graph.inputs) | set(graph.outputs)  # the user's names, then every tensor's
    renamed: dict[tuple[int, str], str] = {}

    def fresh(want: str) -> str:
        name, i = want, 1
        while name in taken:
            name, i = f"{want}_{i}", i + 1
        taken.add(name)
        return name

    for piece, program in zip(pieces, programs):
        mg = program if isinstance(program, MuGraph) else from_graph(program)
        pd = mg.to_dict()
        outer = {inp: tensor_of[id(node)] for inp, node in piece.inputs.items()}
        prefix = f"p{piece.index}_"

        def ren(t: str, outer=outer, prefix=prefix, j=piece.index) -> str:
            if t in outer:
                return outer[t]
            if (j, t) not in renamed:
                renamed[j, t] = fresh(prefix + t)
            return renamed[j, t]

        for kd in pd["kernels"]:
            data["kernels"].append(_rename_kernel(kd, ren, prefix + kd["name"]))
        for out, t in pd["outputs"].items():
            tensor_of[id(piece.outputs[out])] = ren(t)
    for out, node in graph.outputs.items():
        data["outputs"][out] = _leaf_tensor(node, tensor_of, data, fresh)
    return from_dict(data).validate()


def _leaf_tensor(node: Node, tensor_of: dict[int, str], data: dict,
                 fresh: Callable[[str], str]) -> str:
    """The tensor holding ``node``; a causal-mask output gets its own kernel."""
    if id(node) in tensor_of:
        return tensor_of[id(node)]
    if node.op is not Op.CAUSAL:  # a constant output has no kernel (as in from_graph)
        raise MuGraphError(f"output {node.describe()} is computed by no piece")
    frag = Graph("leaf")
    frag.outputs = {"y": node}
    kd = from_graph(frag).to_dict()["kernels"][0]
    t = fresh(f"leaf{len(data['kernels'])}")
    data["kernels"].append(_rename_kernel(kd, lambda _: t, f"k_{t}"))
    tensor_of[id(node)] = t
    return t
