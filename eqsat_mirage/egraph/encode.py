"""Encode a ``Graph`` as egglog terms and decode extracted terms back.

Multi-axis reductions become nested single-axis ones (keepdims, followed by a
Reshape when keepdims is off), transposes become chains of axis swaps, n-ary
concats become nested binary ones and 1-d matmul operands are reshaped to
2-d, so every egglog term has the simple shape rules of rules/schema.egg.
"""

from __future__ import annotations

from ..frontend.graph import Graph
from ..ir.errors import ShapeError
from ..ir.node import REDUCE, Node, Op, make
from ..ir.ops import SPECS

# The ops whose term is their constructor applied to their operands (elementwise, matmul,
# the masks); the reductions, whose term takes an axis. Constructor names: the specs'.
_PLAIN = {op: s.egglog for op, s in SPECS.items()
          if s.arg is None and s.group in ("unary", "logic", "binary", "compare", "matmul",
                                           "select")}
_REDUCE = {op: SPECS[op].egglog for op in REDUCE}
CTOR_OP = {ctor: op for op, ctor in _PLAIN.items()}
REDUCE_CTOR_OP = {ctor: op for op, ctor in _REDUCE.items()}


def _f64(x: float) -> str:
    text = repr(float(x))
    return text if any(c in text for c in ".eEn") else text + ".0"


def _vec(shape) -> str:
    return "(vec-of " + " ".join(str(d) for d in shape) + ")" if shape else "(vec-empty)"


def _swaps(perm: tuple[int, ...]) -> list[tuple[int, int]]:
    """Axis swaps that, applied in order, realise ``np.transpose(x, perm)``."""
    cur = list(range(len(perm)))
    swaps = []
    for i, want in enumerate(perm):
        j = cur.index(want)
        if j != i:
            swaps.append((i, j))
            cur[i], cur[j] = cur[j], cur[i]
    return swaps


class Encoder:
    """Turns nodes into egglog ``let`` commands, one per node, sharing subterms."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.names: dict[int, str] = {}
        # id(node) -> the lets its own terms made, in order (several for a multi-axis
        # reduction, a transpose, an n-ary concat or a matmul of a 1-d operand)
        self.parts: dict[int, list[str]] = {}
        self.terms: dict[str, str] = {}  # let name -> its term
        self._k = 0

    def _let(self, term: str) -> str:
        name = f"$t{self._k}"
        self._k += 1
        self.lines.append(f"(let {name} {term})")
        self.terms[name] = term
        return name

    def encode(self, node: Node) -> str:
        """The global name holding ``node``'s term (encoding operands first)."""
        if id(node) in self.names:
            return self.names[id(node)]
        src = [self.encode(s) for s in node.srcs]
        first = self._k
        op = node.op
        if op is Op.INPUT:
            name = self._let(f'(Input "{node.arg}")')
            self.lines.append(f"(set (ndim {name}) {len(node.shape)})")
            self.lines += [f"(set (dim {name} {i}) {d})" for i, d in enumerate(node.shape)]
        elif op is Op.CONST:
            name = self._let(f"(Const {_f64(node.arg)})")
        elif op is Op.CAST:
            name = self._let(f'(Cast "{node.arg}" {src[0]})')
        elif op in (Op.BITAND, Op.SHR):  # x & mask, x >> shift: the constant first
            name = self._let(f"({SPECS[op].egglog} {node.arg} {src[0]})")
        elif op is Op.SLICE:
            name = self._let("(Slice {} {} {} {})".format(*node.arg, src[0]))
        elif op in (Op.GATHER, Op.TAKE_ALONG_AXIS):  # the axis first
            name = self._let(f"({SPECS[op].egglog} {node.arg} {src[0]} {src[1]})")
        elif op is Op.MATMUL:
            a, b = (src[i] if len(s.shape) > 1 else self._let(
                f"(Reshape {_vec((1, s.shape[0]) if i == 0 else (s.shape[0], 1))} {src[i]})")
                for i, s in enumerate(node.srcs))
            name = self._let(f"(MatMul {a} {b})")
            if any(len(s.shape) == 1 for s in node.srcs):
                name = self._let(f"(Reshape {_vec(node.shape)} {name})")
        elif op in _PLAIN:
            name = self._let(f"({_PLAIN[op]} {' '.join(src)})")
        elif op is Op.CAUSAL:
            name = self._let("(Causal {} {} {})".format(*node.arg))
        elif op in _REDUCE:
            axes, keep = node.arg
            name = src[0]
            for ax in sorted(axes):  # max: ascending, as its field semantics nests it
                name = self._let(f"({_REDUCE[op]} {ax} {name})")
            if not keep:
                name = self._let(f"(Reshape {_vec(node.shape)} {name})")
        elif op is Op.TRANSPOSE:
            name = src[0]
            for i, j in _swaps(node.arg):
                name = self._let(f"(Swap {i} {j} {name})")
        elif op is Op.RESHAPE:
            name = self._let(f"(Reshape {_vec(node.shape)} {src[0]})")
        elif op is Op.CONCAT:
            name = src[0]
            for other in src[1:]:
                name = self._let(f"(Concat {node.arg} {name} {other})")
        else:
            raise NotImplementedError(f"cannot encode {op}")
        self.names[id(node)] = name
        self.parts[id(node)] = [f"$t{k}" for k in range(first, self._k)]
        return name


def encode_graph(graph: Graph) -> tuple[str, dict[str, str]]:
    """egglog commands defining every output of ``graph``; and output -> global name."""
    enc = Encoder()
    roots = {name: enc.encode(node) for name, node in graph.outputs.items()}
    return "\n".join(enc.lines), roots


# Constructors that are the identity on values (their one T argument): a kernel boundary, a
# kernel choice, a max-shifted value and an exp of one (the online softmax), a value that may
# stay in registers
IDENTITIES = ("Dev", "Kern", "Shifted", "Online", "Reg")


def build_node(ctor: str, args: list, inputs: dict[str, Node]) -> Node:
    """Rebuild an IR node from a constructor name and decoded arguments.

    ``args`` holds Nodes for tensor arguments and Python ints/floats/tuples
    for the others.
    """
    if ctor == "Input":
        return inputs[args[0]]
    if ctor == "Const":
        return Node(Op.CONST, (), float(args[0]), (), "float32")
    if ctor in CTOR_OP:
        return make(CTOR_OP[ctor], tuple(args))
    if ctor in REDUCE_CTOR_OP:
        return make(REDUCE_CTOR_OP[ctor], (args[1],), ((int(args[0]),), True))
    if ctor == "Cast":
        return make(Op.CAST, (args[1],), str(args[0]))
    if ctor in ("BitAnd", "Shr"):
        return make(Op.BITAND if ctor == "BitAnd" else Op.SHR, (args[1],), int(args[0]))
    if ctor == "Slice":
        return make(Op.SLICE, (args[3],), tuple(int(a) for a in args[:3]))
    if ctor == "Gather":
        return make(Op.GATHER, (args[1], args[2]), int(args[0]))
    if ctor == "TakeAlongAxis":
        return make(Op.TAKE_ALONG_AXIS, (args[1], args[2]), int(args[0]))
    if ctor == "Causal":
        return make(Op.CAUSAL, (), tuple(int(a) for a in args))
    if ctor == "Swap":
        i, j, x = args
        if not all(-len(x.shape) <= a < len(x.shape) for a in (i, j)):
            raise ShapeError(f"swap of axes {i} and {j} of a {len(x.shape)}-d tensor")
        perm = list(range(len(x.shape)))
        perm[i], perm[j] = perm[j], perm[i]
        return make(Op.TRANSPOSE, (x,), tuple(perm))
    if ctor == "Reshape":
        return make(Op.RESHAPE, (args[1],), tuple(args[0]))
    if ctor == "Concat":
        return make(Op.CONCAT, (args[1], args[2]), int(args[0]))
    if ctor in IDENTITIES:  # the value is the last argument (a Kern's first: its schedule)
        return args[-1]
    raise NotImplementedError(f"cannot decode constructor {ctor}")


def graph_from_outputs(template: Graph, outputs: dict[str, Node], name: str) -> Graph:
    """A Graph with ``template``'s inputs and the given output nodes."""
    g = Graph(name)
    g.inputs = dict(template.inputs)
    g.outputs = dict(outputs)
    return g
