"""Per-op rules generated from the ops' specs (ir/ops.py), where a rule file says so.

A line ``(op-rules FAMILY)`` in a file of rules/ stands for one rule per op (or per
operand of each op) of that family, written out when the file loads, in the order of
``ir.ops.SPECS``. The families, each in its ruleset:

- ``shape`` (rules/schema.egg, ruleset ``shapes``): each op's ``ndim`` and ``dim`` rules,
  by its group (an elementwise unary op or a logical not keeps its operand's shape, a binary,
  select or logic op of two operands broadcasts them, ...) or, for an op with a shape of its
  own (a constant,
  the movement ops, the causal mask), by its entry in ``_OWN_SHAPES``;
- ``is-op`` (rules/schema.egg, ruleset ``shapes``): ``(is-op e)`` for every op but the
  leaves;
- ``absval`` (rules/guards.egg, ruleset ``absrules``): each op's abstract expression, its
  spec's ``guard`` over its operands' (an input's, its own name, is written in the file);
- ``dev`` (rules/tiling.egg, ruleset ``tiling``): one rewrite per operand of each op,
  letting that operand come from device memory when it is computed by an op;
- ``reg`` (rules/thread.egg, ruleset ``thread``): one rewrite per elementwise op, letting
  its value stay in registers.

The first three are egglog ``rule`` commands (schema.egg and guards.egg are egglog read
as they are); the last two are rewrites with their one-line comments, checked like any
rule of a rule file. Adding an op of an existing group needs nothing here; an op with a
shape of its own (a new movement op) adds its entry to ``_OWN_SHAPES``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ..ir.errors import RuleError
from ..ir.ops import ELEMENTWISE, SPECS, Op, OpSpec

# family -> (ruleset, whether it makes rewrites of a rule file, else egglog rules)
FAMILIES = {"shape": ("shapes", False), "is-op": ("shapes", False),
            "absval": ("absrules", False), "dev": ("tiling", True), "reg": ("thread", True)}

# The argument names of the ops whose shape rules are their own (written below); every
# other op names a string argument t, an integer one ax, its T operands x, a b or c a b
# (a mask's: c x).
_ARGS = {Op.CONST: ("c",), Op.TRANSPOSE: ("i", "j", "x"), Op.RESHAPE: ("s", "x"),
         Op.CONCAT: ("ax", "a", "b"), Op.SLICE: ("ax", "lo", "hi", "x"),
         Op.CAUSAL: ("r", "c", "o"), Op.GATHER: ("ax", "x", "i"),
         Op.TAKE_ALONG_AXIS: ("ax", "x", "i")}
_OPERANDS = {1: ("x",), 2: ("a", "b"), 3: ("c", "a", "b")}
_PARAM = {"String": "t", "i64": "ax", "IVec": "s"}


def _rule(p: str, query: str, actions: str) -> str:
    """One ``shapes`` rule: for every e-node ``e`` matching ``p`` where ``query`` holds."""
    return f"(rule ((= e {p}){' ' if query else ''}{query}) ({actions}) :ruleset shapes)"


def _same(p: str, xs: tuple[str, ...]) -> list[str]:
    """An elementwise unary op keeps its operand's shape."""
    (x,) = xs
    return [_rule(p, f"(= n (ndim {x}))", "(set (ndim e) n)"),
            _rule(p, f"(= d (dim {x} i))", "(set (dim e i) d)")]


def _broadcast(p: str, xs: tuple[str, ...]) -> list[str]:
    """NumPy broadcasting: the rank is the largest, the dims align from the right."""
    rank = f"r{xs[-1]}"
    for x in reversed(xs[:-1]):
        rank = f"(max r{x} {rank})"
    return [_rule(p, " ".join(f"(= r{x} (ndim {x}))" for x in xs), f"(set (ndim e) {rank})")] + [
        _rule(p, f"(= r (ndim e)) (= r{x} (ndim {x})) (= d (dim {x} i))",
              f"(set (dim e (+ i (- r r{x}))) d)") for x in xs]


def _matmul(p: str, xs: tuple[str, ...]) -> list[str]:
    """Batch dims broadcast, then the rows of a and the columns of b."""
    a, b = xs
    return [_rule(p, f"(= r{a} (ndim {a})) (= r{b} (ndim {b}))", f"(set (ndim e) (max r{a} r{b}))")
            ] + [_rule(p, f"(= r (ndim e)) (= r{x} (ndim {x})) (= d (dim {x} i)) (< i (- r{x} 2))",
                       f"(set (dim e (+ i (- r r{x}))) d)") for x in xs] + [
        _rule(p, f"(= r (ndim e)) (= r{a} (ndim {a})) (= d (dim {a} (- r{a} 2)))",
              "(set (dim e (- r 2)) d)"),
        _rule(p, f"(= r (ndim e)) (= r{b} (ndim {b})) (= d (dim {b} (- r{b} 1)))",
              "(set (dim e (- r 1)) d)")]


def _reduce(p: str, xs: tuple[str, ...]) -> list[str]:
    """A reduction keeps the rank; the reduced axis becomes 1."""
    (x,) = xs
    return [_rule(p, f"(= n (ndim {x}))", "(set (ndim e) n) (set (dim e ax) 1)"),
            _rule(p, f"(= d (dim {x} i)) (!= i ax)", "(set (dim e i) d)")]


_BY_GROUP: dict[str, Callable[[str, tuple[str, ...]], list[str]]] = {
    "unary": _same, "logic": _same, "binary": _broadcast, "compare": _broadcast,
    "select": _broadcast, "matmul": _matmul,
    "reduce": _reduce}

_GATHER = "(Gather ax x i)"  # the indices' shape takes the axis's place
_TAKE_ALONG = "(TakeAlongAxis ax x i)"  # the indices' shape (the table's but along ax)
_SLICE, _SWAP, _RESHAPE, _CONCAT = ("(Slice ax lo hi x)", "(Swap i j x)", "(Reshape s x)",
                                    "(Concat ax a b)")
# The ops whose shape is their own (an input's is set when the program is encoded).
_OWN_SHAPES: dict[Op, list[str]] = {
    Op.CONST: [_rule("(Const c)", "", "(set (ndim e) 0)")],
    Op.SLICE: [_rule(_SLICE, "(= n (ndim x))", "(set (ndim e) n)"),
               _rule(_SLICE, "(= d (dim x i)) (!= i ax)", "(set (dim e i) d)"),
               _rule(_SLICE, "", "(set (dim e ax) (- hi lo))")],
    Op.CAUSAL: [_rule("(Causal r c o)", "",
                      "(set (ndim e) 2) (set (dim e 0) r) (set (dim e 1) c)")],
    Op.TRANSPOSE: [_rule(_SWAP, "(= n (ndim x))", "(set (ndim e) n)"),
                   _rule(_SWAP, "(= d (dim x j))", "(set (dim e i) d)"),
                   _rule(_SWAP, "(= d (dim x i))", "(set (dim e j) d)"),
                   _rule(_SWAP, "(= d (dim x k)) (!= k i) (!= k j)", "(set (dim e k) d)")],
    Op.RESHAPE: [_rule(_RESHAPE, "", "(set (ndim e) (vec-length s))"),
                 *(_rule(_RESHAPE, f"(> (vec-length s) {k})", f"(set (dim e {k}) (vec-get s {k}))")
                   for k in range(6))],  # ranks up to 6
    Op.GATHER: [_rule(_GATHER, "(= rx (ndim x)) (= ri (ndim i))",
                      "(set (ndim e) (+ (- rx 1) ri))"),
                _rule(_GATHER, "(= d (dim x k)) (< k ax)", "(set (dim e k) d)"),
                _rule(_GATHER, "(= d (dim i k))", "(set (dim e (+ ax k)) d)"),
                _rule(_GATHER, "(= ri (ndim i)) (= d (dim x k)) (> k ax)",
                      "(set (dim e (+ k (- ri 1))) d)")],
    Op.TAKE_ALONG_AXIS: [_rule(_TAKE_ALONG, "(= n (ndim i))", "(set (ndim e) n)"),
                         _rule(_TAKE_ALONG, "(= d (dim i k))", "(set (dim e k) d)")],
    Op.CONCAT: [_rule(_CONCAT, "(= n (ndim a))", "(set (ndim e) n)"),
                _rule(_CONCAT, "(= d (dim a i)) (!= i ax)", "(set (dim e i) d)"),
                _rule(_CONCAT, "(= da (dim a ax)) (= db (dim b ax))",
                      "(set (dim e ax) (+ da db))")],
}


def _arguments(s: OpSpec, sorts: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The pattern variables of ``s``'s constructor (its argument ``sorts`` in the schema)
    and which of them are its T operands, in order."""
    names = _ARGS.get(s.op)
    if names is None:
        count = sum(1 for t in sorts if t == "T")
        operands = iter(("c", "x") if s.group == "select" and count == 2 else
                        _OPERANDS.get(count, ()))
        names = tuple(next(operands, "?") if t == "T" else _PARAM.get(t, "p") for t in sorts)
    if len(names) != len(sorts):
        raise RuleError(f"{s.egglog} has {len(sorts)} arguments in rules/schema.egg, "
                        f"egraph/op_rules.py names {len(names)}")
    return names, tuple(n for n, t in zip(names, sorts) if t == "T")


def _pattern(ctor: str, names: tuple[str, ...]) -> str:
    return f"({ctor} {' '.join(names)})" if names else f"({ctor})"


def _operand_words(s: OpSpec, n: int) -> list[str]:
    """What a rule's comment calls each of ``n`` operands: the operand, the left and right
    operands, or a select's condition and value(s)."""
    if n == 1:
        return ["operand"]
    if s.group == "select":
        return ["condition", *(["value"] if n == 2 else ["first value", "second value"])]
    return ["left operand", "right operand"] if n == 2 else [f"operand {k + 1}" for k in range(n)]


def _shape_rules(s: OpSpec, names: tuple[str, ...], xs: tuple[str, ...]) -> list[str]:
    """The ``shapes`` rules of op ``s`` (none for an input: its shape is encoded)."""
    if s.op in _OWN_SHAPES:
        return _OWN_SHAPES[s.op]
    make = _BY_GROUP.get(s.group)
    if s.group == "logic" and len(xs) > 1:  # and, or of two bool masks: broadcast
        make = _broadcast
    return make(_pattern(s.egglog, names), xs) if make else []


def _one_op(family: str, s: OpSpec, names: tuple[str, ...], xs: tuple[str, ...]) -> list[str]:
    """The rules of ``family`` for op ``s`` (its pattern's variables ``names``, operands
    ``xs``): egglog commands, or a rule file's comment and rewrite lines."""
    p = _pattern(s.egglog, names)
    if family == "shape":
        return _shape_rules(s, names, xs)
    if family == "is-op":
        return [] if s.group == "leaf" else [f"(rule ((= e {p})) ((is-op e)) :ruleset shapes)"]
    if family == "absval":
        if s.guard is None:
            return []
        facts = "".join(f" (= v{x} (absval {x}))" for x in xs)
        value = s.guard.format(*(f"v{x}" for x in xs))
        return [f"(rule ((= e {p}){facts}) ((set (absval e) {value})) :ruleset absrules)"]
    if family == "dev":
        out = []
        for x, word in zip(xs, _operand_words(s, len(xs))):
            read = _pattern(s.egglog, tuple(f"(Dev {n})" if n == x else n for n in names))
            out += [f"; {s.name} may read its {word} from device memory",
                    f"(rewrite {p} {read} :when ((is-op {x})) :ruleset tiling)"]
        return out
    if s.op not in ELEMENTWISE:  # reg
        return []
    return [f"; {s.name} may stay in registers for its one elementwise user (a thread graph)",
            f"(rewrite {p} (Reg {p}) :ruleset thread)"]


def rules_of(family: str, s: OpSpec, constructors: dict[str, tuple[str, ...]]) -> list[str]:
    """The lines ``(op-rules family)`` writes for op ``s`` (none for an op without an egglog
    constructor): egglog commands, or a rule file's comment and rewrite lines.
    ``constructors``: the schema's T constructors and their argument sorts
    (``rulefiles.Schema``)."""
    if family not in FAMILIES:
        raise RuleError(f"unknown op-rules family {family!r} (the families: "
                        f"{', '.join(FAMILIES)})")
    if s.egglog is None:
        return []
    if s.egglog not in constructors:
        raise RuleError(f"op {s.name}: its constructor {s.egglog} is not in rules/schema.egg")
    names, xs = _arguments(s, constructors[s.egglog])
    return _one_op(family, s, names, xs)


def op_rules(family: str, constructors: dict[str, tuple[str, ...]]) -> str:
    """The text ``(op-rules family)`` stands for: ``rules_of`` every op, in ``SPECS``'
    order, one line each."""
    return "".join(line + "\n" for s in SPECS.values()
                   for line in rules_of(family, s, constructors))


def written_out(text: str, constructors: dict[str, tuple[str, ...]], path: str) -> str:
    """``text``, an egglog file read as it is (rules/schema.egg, rules/guards.egg), with each
    line ``(op-rules FAMILY)`` replaced by the egglog rules it stands for."""
    def family(m: re.Match) -> str:
        if FAMILIES.get(m.group(1), ("", True))[1]:
            line = text[:m.start()].count("\n") + 1
            kinds = ", ".join(f for f, (_, rewrites) in FAMILIES.items() if not rewrites)
            raise RuleError(f"{path}:{line}: an egglog file's (op-rules FAMILY) takes one of "
                            f"{kinds}, got {m.group(0).strip()}")
        return op_rules(m.group(1), constructors)
    return re.sub(r"^\(op-rules\s+([^\s()]+)\)[ \t]*\n?", family, text, flags=re.M)
