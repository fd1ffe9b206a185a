"""Repeated pieces: each piece's context, and what the end-to-end check of a stitched
program needs of a program whose pieces repeat (docs/verifier.md, section 5).

A piece's *context* is its program (equal up to renaming: ``texts``) and, for each of its
inputs in order, the program and output of the piece that computes it, or "an input of the
whole program". In a stack of identical layers the first layer's pieces have contexts of
their own (they read the model's input), the second layer's first pieces too (they read
the first layer), and from the third layer on every context repeats one of the second's.

- ``peaked_inputs``: the inputs the end-to-end check's per-input draws take (those read by
  the first occurrence of each context);
- ``first_contexts``: the shortest prefix of the pieces that holds the first occurrence
  of every context, as a program of its own (its inputs, the whole program's outputs it
  computes, and the tensors later pieces read from it): what the end-to-end check runs on.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..frontend.graph import Graph
from ..ir.node import Op
from .pieces import Piece


def contexts(pieces: list[Piece], texts: list[str]) -> list[tuple]:
    """Each piece's context: its program (``texts``, equal up to renaming) and, for each of
    its inputs in order, the program and output name of the piece that computes it, or
    "input" for an input of the whole program. Pieces with one context are the same
    program fed by the same kinds of producers (the layers of a stack after the first)."""
    made: dict[int, tuple[str, str]] = {}
    for p, text in zip(pieces, texts):
        for name, node in p.outputs.items():
            made[id(node)] = (text, name)
    return [(text, tuple(("input",) if node.op is Op.INPUT else
                         made.get(id(node), ("node", id(node))) for node in p.inputs.values()))
            for p, text in zip(pieces, texts)]


def peaked_inputs(graph: Graph, pieces: list[Piece], texts: list[str]) -> list[str] | None:
    """The inputs of ``graph`` that the end-to-end check's per-input draws take
    (docs/verifier.md, section 5): those read by the first piece of each distinct context,
    and any that no piece reads; None (every input) when no context repeats."""
    seen: set[tuple] = set()
    first: set[str] = set()
    read: set[str] = set()
    for p, ctx in zip(pieces, contexts(pieces, texts)):
        names = {node.arg for node in p.inputs.values() if node.op is Op.INPUT}
        read |= names
        if ctx not in seen:
            seen.add(ctx)
            first |= names
    if len(seen) == len(pieces):
        return None
    return [n for n in graph.inputs if n in first or n not in read]


@dataclass(frozen=True)
class Prefix:
    """The first ``len(pieces)`` pieces of a program as a program of their own: ``graph``
    reads the whole program's inputs these pieces read and writes the whole program's
    outputs they compute and every tensor a later piece reads from them (``cut``: its
    output names for those); ``texts``: the pieces' program texts."""

    graph: Graph
    pieces: list[Piece]
    texts: list[str]
    cut: tuple[str, ...]


def first_contexts(graph: Graph, pieces: list[Piece], texts: list[str]) -> Prefix | None:
    """The shortest prefix of ``pieces`` (in their order, producers first) that holds the
    first occurrence of every piece context, as a ``Prefix``; None when that is every
    piece (no context repeats after the last new one)."""
    seen: set[tuple] = set()
    last = -1
    for i, ctx in enumerate(contexts(pieces, texts)):
        if ctx not in seen:
            seen.add(ctx)
            last = i
    if last >= len(pieces) - 1:
        return None
    head, rest = pieces[:last + 1], pieces[last + 1:]
    made = {id(node) for p in head for node in p.outputs.values()}
    read_later = {id(node) for p in rest for node in p.inputs.values()}
    read = {node.arg for p in head for node in p.inputs.values() if node.op is Op.INPUT}
    sub = Graph(f"{graph.name}_first_{len(head)}_pieces")
    sub.inputs = {n: node for n, node in graph.inputs.items() if n in read}
    sub.outputs = {n: node for n, node in graph.outputs.items() if id(node) in made}
    taken = set(sub.inputs) | set(graph.outputs)
    written = {id(node) for node in sub.outputs.values()}
    cut = []
    for p in head:
        for node in p.outputs.values():
            if id(node) in read_later and id(node) not in written:
                name, k = f"cut{len(cut)}", 1
                while name in taken:
                    name, k = f"cut{len(cut)}_{k}", k + 1
                taken.add(name)
                written.add(id(node))
                sub.outputs[name] = node
                cut.append(name)
    return Prefix(sub, head, texts[:last + 1], tuple(cut))
