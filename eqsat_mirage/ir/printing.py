"""Readable SSA-style listings of programs."""

from __future__ import annotations

from .node import Node, Op


def short_dtype(dtype: str) -> str:
    """The listing's short name of a dtype: ``f16``, ``bf16``, ``f32`` or ``bool``."""
    return {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "bool": "bool",
            "int64": "i64", "int32": "i32", "int8": "i8", "uint8": "u8",
            "float8_e4m3fn": "f8e4m3fn", "float8_e5m2": "f8e5m2"}[dtype]


def op_attrs(node: Node) -> str:
    """A node's attributes as the listing shows them after the op name (axes, shape,
    dtype, slice bounds, mask offsets), with a leading space; empty when it has none."""
    if node.op in (Op.SUM, Op.MEAN, Op.MAX):
        axes, keep = node.arg
        return f" axis={list(axes)}" + (" keepdims" if keep else "")
    if node.op in (Op.TRANSPOSE, Op.RESHAPE):
        return f" {list(node.arg)}"
    if node.op in (Op.CONCAT, Op.GATHER, Op.TAKE_ALONG_AXIS):
        return f" axis={node.arg}"
    if node.op is Op.CAST:
        return f" to={node.arg}"
    if node.op is Op.BITAND:
        return f" {node.arg:#x}"
    if node.op is Op.SHR:
        return f" {node.arg}"
    if node.op is Op.SLICE:
        return f" axis={node.arg[0]} [{node.arg[1]}:{node.arg[2]}]"
    if node.op is Op.CAUSAL:
        return f" rows={node.arg[0]} cols={node.arg[1]} offset={node.arg[2]}"
    return ""


def format_graph(program) -> str:
    """Return the program as one line per op, inputs and outputs named."""
    ins = ", ".join(f"{n}: {short_dtype(v.dtype)}{list(v.shape)}"
                    for n, v in program.inputs.items())
    lines = [f"graph {program.name}({ins})"]
    names: dict[int, str] = {id(v): n for n, v in program.inputs.items()}
    k = 0
    for node in program.nodes():
        if node.op is Op.INPUT:
            names[id(node)] = node.arg
            continue
        if node.op is Op.CONST:
            names[id(node)] = repr(node.arg)
            continue
        names[id(node)] = f"%{k}"
        args = ", ".join(names[id(s)] for s in node.srcs)
        rhs = f"{node.op.name.lower()}{op_attrs(node)} {args}"
        lines.append(f"  %{k} = {rhs:<40} : {short_dtype(node.dtype)}{list(node.shape)}")
        k += 1
    for name, node in program.outputs.items():
        lines.append(f"  {name} <- {names[id(node)]}")
    return "\n".join(lines)
