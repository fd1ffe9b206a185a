"""A plain-torch implementation of a program: one torch op per kernel-level op.

``torch_reference(program)`` is used where a program must run as torch without
Triton: the ``torch.compile`` backend on CPU tensors (``dynamo/backend.py``), and the
"torch eager" column of ``bench/gpu_bench.py``. torch is imported on first use.
"""

from __future__ import annotations

from collections.abc import Callable

from ..ir.errors import MirageError
from ..ir.node import Op, slice_index


def _tiled(mugraph) -> Callable:
    """``fn(**tensors)`` running ``mugraph``'s tiling for real (the tiled interpreter, each
    tensor rounded to its dtype as a GPU stores it), for MuGraphs without a reference."""
    import numpy as np
    import torch

    def fn(**tensors):
        device = next(iter(tensors.values())).device
        feed = {k: v.detach().cpu().double().numpy() for k, v in tensors.items()}
        out = mugraph.evaluate(feed, dtype="native")
        return {name: torch.as_tensor(np.asarray(v), dtype=getattr(
            torch, mugraph.tensors[mugraph.output_tensors[name]].dtype), device=device)
            for name, v in out.items()}
    return fn


def torch_reference(program) -> Callable:
    """A plain torch function ``fn(**tensors) -> {output: tensor}`` computing ``program``.

    ``program`` is a kernel-level ``em.Graph`` or a ``MuGraph`` (run through the
    kernel-level Graph it computes, ``MuGraph.reference()``; a MuGraph with a split
    kernel, which has no kernel-level source, runs its tiling in the tiled interpreter).
    Walks the nodes in order with one torch op per kernel-level op; constants stay Python floats so
    tensors keep their dtype (the tensors given, not the graph's declared dtypes);
    mixed-dtype matmul and concat operands are promoted to a common dtype.
    """
    import torch
    import torch.nn.functional as F  # noqa: N812

    try:
        graph = program.reference() if hasattr(program, "kernels") else program
    except MirageError:  # a split kernel (part + reduce) has no kernel-level source graph
        return _tiled(program)
    unary = {Op.NEG: torch.neg, Op.EXP: torch.exp, Op.SQRT: torch.sqrt, Op.RSQRT: torch.rsqrt,
             Op.SILU: F.silu, Op.RELU: torch.relu, Op.TANH: torch.tanh, Op.ERF: torch.erf,
             Op.COS: torch.cos, Op.SIN: torch.sin}
    binary = {Op.ADD: torch.add, Op.SUB: torch.sub, Op.MUL: torch.mul, Op.DIV: torch.div}
    nodes = graph.nodes()
    outputs = dict(graph.outputs)

    def cast(xs) -> list:
        """Operands of mixed dtypes promoted to a common one (torch.matmul/cat need one)."""
        dtypes = {x.dtype for x in xs}
        if len(dtypes) == 1:
            return xs
        common = dtypes.pop()
        for d in dtypes:
            common = torch.promote_types(common, d)
        return [x.to(common) for x in xs]

    def fn(**tensors):
        env: dict[int, object] = {}
        for n in nodes:
            xs = [env[id(s)] for s in n.srcs]
            if n.op is Op.INPUT:
                v = tensors[n.arg]
            elif n.op is Op.CONST:
                v = float(n.arg)
            elif n.op in unary:
                v = unary[n.op](xs[0])
            elif n.op in binary:
                v = binary[n.op](*xs)
            elif n.op is Op.MATMUL:
                v = torch.matmul(*cast(xs))
            elif n.op in (Op.SUM, Op.MEAN, Op.MAX):
                axes, keep = n.arg
                red = {Op.SUM: torch.sum, Op.MEAN: torch.mean, Op.MAX: torch.amax}[n.op]
                # torch reduces over every axis for dim=(): an empty reduction is the identity
                v = red(xs[0], dim=tuple(axes), keepdim=bool(keep)) if axes else xs[0]
            elif n.op is Op.TRANSPOSE:
                v = xs[0].permute(*n.arg)
            elif n.op is Op.RESHAPE:
                v = xs[0].reshape(*n.arg)
            elif n.op is Op.CONCAT:
                v = torch.cat(cast(xs), dim=n.arg)
            elif n.op is Op.CAST:
                v = xs[0].to(getattr(torch, n.arg))
            elif n.op is Op.SLICE:
                v = xs[0][slice_index(n.arg)]
            elif n.op is Op.CAUSAL:
                v = torch.ones(n.arg[:2], dtype=torch.bool).tril(n.arg[2])
            elif n.op is Op.WHERE:
                v = torch.where(xs[0].bool(), xs[1], xs[2])
            elif n.op is Op.MASK:
                v = torch.where(xs[0].bool(), xs[1], float("-inf"))
            else:
                raise MirageError(f"torch_reference: no torch op for {n.describe()}")
            env[id(n)] = v
        return {name: env[id(n)] for name, n in outputs.items()}

    return fn
