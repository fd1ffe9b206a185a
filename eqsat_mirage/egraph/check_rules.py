"""``em.check_rules``: test every rewrite rule for soundness on random instances.

Tensor pattern variables become float32 inputs of random small shapes, axis
variables small valid ints, f64 variables dyadic floats; an instance counts when
the left side type-checks and the ``:when`` facts hold (a block-level fact's values drawn
again for the same shapes where one fails). Its right side must then
type-check to the same shape, and a few instances are compared by ``em.verify``
(without its native-dtype checks): "sound" means equal over the reals. Each sound rule's
instances then go through the float-safety check of ``em.verify`` (static checks and the
native-dtype draws, docs/verifier.md section 5), tensor variables drawn in float16 and
bfloat16 as well as float32: a rule that drops a softmax's max or narrows a dtype is
"sound, float-unsafe" (``RuleCheck.float_safe`` False). The verdicts and the report that
prints them: ``rule_report.py``.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

from ..frontend.graph import Graph
from ..ir.errors import DTypeError, MirageError, RuleError, ShapeError
from ..ir.limits import Deadline, check_seconds
from ..ir.node import DTYPES, LOGIC_BINARY, Node, Op, fmt_shape, make, numel
from ..ir.ops import SPECS
from ..verifier.floatcheck import float_checks
from ..verifier.verify import Counterexample, verify
from .encode import IDENTITIES, build_node
from .rule_report import RuleCheck, RuleCheckReport, printable
from .rulefiles import Rule, Schema, SList, Sym, load_rules, to_text

_POOLS = ((2, 3), (1, 2, 3), (2, 3, 4), (1, 2, 3, 4, 6), (2, 4, 6), (3,), (1, 2))
_FLOATS = (0.5, 1.5, -2.0, 3.0, 0.25, -0.75)
# A block-level rule (rules/block.egg) must keep the value for every fact a user file may add
# (any loop range, split part count or bound), so a relation's unbound argument is drawn
# from these small values and a bound (min-loop-range, max-loop-range) leaves the range open.
_FACT_VALUES = (1, 2, 4)
_OPEN_BOUND = {"min": 1, "max": 2**31}
_REDRAWS = 8  # an instance's block-level fact values drawn again when a fact fails


class _Fail(Exception):  # noqa: N818 - no instance here: a fact is false or a term undefined
    pass


def _is_var(x) -> bool:
    return isinstance(x, Sym) and (x[0].islower() or x[0] == "_")


def _num(x: str) -> int | float | None:
    if _is_var(x) or x[0].isalpha():  # a variable or a name, not a number
        return None
    try:
        return int(x) if x.lstrip("-").isdigit() else float(x)
    except ValueError:
        return None


def _tensor_vars(term, schema: Schema, out: list) -> list:
    """Tensor pattern variables (sort T) of ``term``, in order of appearance."""
    if isinstance(term, SList) and term.head() in schema.constructors:
        for sort, arg in zip(schema.constructors[term.head()], term.items[1:]):
            name = str(arg).strip('"')
            tensor = sort == "String" and term.head() == "Input" or sort == "T" and _is_var(arg)
            if tensor and name not in out:
                out.append(name)
            _tensor_vars(arg, schema, out)
    return out


_MASKS_COMBINED = frozenset(SPECS[op].egglog for op in LOGIC_BINARY)  # And, Or


def _mask_vars(term, out: set) -> set:
    """Pattern variables in the condition of a Where or Mask, negated by a Not or combined by
    an And or Or: they become bool masks."""
    if isinstance(term, SList):
        if term.head() in ("Where", "Mask", "Not") and len(term.items) > 1 and \
                _is_var(term.items[1]):
            out.add(str(term.items[1]))
        if term.head() in _MASKS_COMBINED:  # both operands are masks
            out.update(str(a) for a in term.items[1:] if _is_var(a))
        for arg in term.items[1:]:
            _mask_vars(arg, out)
    return out


def _index_vars(term, out: set) -> set:
    """Pattern variables a Gather or a TakeAlongAxis reads as its indices: they become int64
    index inputs (the field and float draws give them valid indices of the table they
    index)."""
    if isinstance(term, SList):
        if term.head() in ("Gather", "TakeAlongAxis") and len(term.items) > 3 and \
                _is_var(term.items[3]):
            out.add(str(term.items[3]))
        for arg in term.items[1:]:
            _index_vars(arg, out)
    return out


def _int_vars(term, out: set) -> set:
    """Pattern variables a bit op (BitAnd, Shr) reads, directly or through identity
    constructors (Dev, Reg, ...): they become uint8 inputs (packed weights)."""
    if isinstance(term, SList):
        if term.head() in ("BitAnd", "Shr") and len(term.items) > 2:
            x = term.items[2]
            while isinstance(x, SList) and x.head() in IDENTITIES and len(x.items) > 1:
                x = x.items[-1]
            if _is_var(x):
                out.add(str(x))
        for arg in term.items[1:]:
            _int_vars(arg, out)
    return out


def _factorize(n: int, k: int, rng: random.Random) -> tuple[int, ...]:
    """A random ordered factorization of ``n`` into ``k`` positive factors."""
    out = []
    for _ in range(k - 1):
        out.append(rng.choice([d for d in range(1, n + 1) if n % d == 0]))
        n //= out[-1]
    return tuple(out) + (n,) if k else ()


class _Instance:
    """One attempt at instantiating a rule: variable bindings and a term builder."""

    def __init__(self, schema: Schema, rng: random.Random, shapes: dict[str, tuple],
                 drawn: dict | None = None, masks: frozenset = frozenset(),
                 dtype: str = "float32", indices: frozenset = frozenset(),
                 ints: frozenset = frozenset()) -> None:
        self.schema, self.rng, self.shapes, self.masks = schema, rng, shapes, masks
        self.indices = indices  # variables a gather reads as indices: int64
        self.dtype = dtype  # of every tensor variable but masks and indices
        self.ints = ints  # variables a bit op (BitAnd, Shr) reads: uint8
        self.inputs = {v: Node(Op.INPUT, (), v, s, "bool" if v in masks else
                               "int64" if v in indices else "uint8" if v in self.ints
                               else dtype)
                       for v, s in shapes.items()}
        self.env: dict[str, object] = {**self.inputs, **(drawn or {})}
        self.drawn = dict(drawn or {})  # scalars drawn while building the LHS
        self.facts: set[str] = set()  # those drawn for a block-level fact (``redrawn``)
        self.repair: tuple | None = None  # (tensor var, axis or None for rank, wanted value)

    def _want(self, term, axis, value) -> None:  # a shape change that could pass a check
        if _is_var(term) and str(term) in self.inputs and self.repair is None:
            self.repair = (str(term), axis, value)

    def repaired(self) -> _Instance:
        """A fresh instance with the noted shape change (same drawn scalars)."""
        var, axis, value = self.repair
        shape = list(self.shapes[var])
        ok = isinstance(value, int) and (0 <= value <= 6 if axis is None else value >= 1)
        if ok and axis is None:
            shape = ([self.rng.choice((2, 3))] * value + shape)[len(shape):]
        elif ok and -len(shape) <= axis < len(shape):
            shape[axis] = value
        out = _Instance(self.schema, self.rng, {**self.shapes, var: tuple(shape)}, self.drawn,
                        self.masks, self.dtype, self.indices, self.ints)
        out.facts = set(self.facts)  # still the block-level facts' (``redrawn``)
        return out

    def redrawn(self) -> _Instance:
        """A fresh instance with the same shapes and scalars but the values drawn for
        block-level facts, drawn again (a loop range that does not divide the size)."""
        kept = {k: v for k, v in self.drawn.items() if k not in self.facts}
        return _Instance(self.schema, self.rng, self.shapes, kept, self.masks, self.dtype,
                         self.indices, self.ints)

    def build(self, term, lhs: bool) -> Node:
        """The IR node of a T-sorted term; in the LHS, unbound scalars get random values."""
        if _is_var(term):
            return self.env[str(term)]
        if not isinstance(term, SList):
            raise ShapeError(f"{term!r} is not a tensor term")
        ctor = term.head()
        if ctor == "Input":
            return self.inputs[str(term.items[1]).strip('"')]
        sorts, items = self.schema.constructors[ctor], term.items[1:]
        args = [self.build(a, lhs) if s == "T" else None for s, a in zip(sorts, items)]
        for k, (sort, a) in enumerate(zip(sorts, items)):
            if sort != "T":
                args[k] = self.scalar(ctor, sort, k, a, args, lhs)
        if ctor == "MatMul":
            a, b = args[0].shape, args[1].shape
            for k in range(2 * lhs):  # note shape repairs that would make it type-check
                if len(args[k].shape) < 2:
                    self._want(items[k], None, 2)
            if min(len(a), len(b)) < 2:
                raise ShapeError(f"MatMul operands must have rank >= 2, got {fmt_shape(a)} "
                                 f"and {fmt_shape(b)}")
            if a[-1] != b[-2] and lhs:
                self._want(items[1], -2, a[-1])
                self._want(items[0], -1, b[-2])
        if ctor == "Swap" and not all(0 <= ax < len(args[2].shape) for ax in args[:2]):
            raise ShapeError(f"Swap {args[0]} {args[1]} of a {len(args[2].shape)}-d tensor")
        return build_node(ctor, args, self.inputs)

    def scalar(self, ctor: str, sort: str, k: int, term, args: list, lhs: bool):
        """A non-tensor argument: literal, bound or (LHS only) freshly drawn variable."""
        if isinstance(term, SList) and term.head() == "vec-of" and lhs:
            return self._vec_pattern(term, args)
        if _is_var(term) and str(term) not in self.env:
            if not lhs:
                raise KeyError(str(term))
            shape = next((a.shape for a in args if isinstance(a, Node)), ())  # operand's
            if sort == "i64":
                value = self.rng.randrange(len(shape)) if shape else 0
            elif sort == "f64":
                value = self.rng.choice(_FLOATS)
            elif sort == "String":  # a Cast's dtype
                value = self.rng.choice(DTYPES)
            else:  # IVec: a reshape target of the operand's size
                value = _factorize(numel(shape), self.rng.randint(1, 4), self.rng)
            self.env[str(term)] = self.drawn[str(term)] = value
        value = self.eval(term)
        if {"i64": int, "f64": float, "String": str}.get(sort, type(value)) is not type(value):
            raise ShapeError(f"{ctor} argument {k + 1} is {value!r}, not an {sort}")
        return value

    def _vec_pattern(self, term: SList, args: list) -> tuple:
        free = [str(x) for x in term.items[1:] if _is_var(x) and str(x) not in self.env]
        known = math.prod(self.eval(x) for x in term.items[1:] if str(x) not in free)
        n = numel(args[1].shape)
        if known <= 0 or n % known or (not free and n != known):
            raise ShapeError(f"cannot reshape {fmt_shape(args[1].shape)} to {to_text(term)}")
        for v, d in zip(free, _factorize(n // known, len(free), self.rng)):
            self.env[v] = self.drawn[v] = d
        return self.eval(term)

    def eval(self, x):
        """Value of a scalar expression (number, variable, primitive or shape fact)."""
        if isinstance(x, str):  # a Sym, or a String literal (the parser keeps those as str)
            if str(x).startswith('"'):
                return str(x).strip('"')  # a String literal (a Cast's dtype)
            return _num(x) if _num(x) is not None else self.env[str(x)]  # KeyError: unbound
        op, args = x.head(), x.items[1:]
        if op in self.schema.constructors:
            return self.build(x, lhs=False)
        if op in self.schema.others:  # a schedule term (Sched, LoopOver, ...): its arguments
            sorts = self.schema.others[op][0]
            return (op, *(self.build(a, lhs=False) if s == "T" else self.eval(a)
                          for s, a in zip(sorts, args)))
        if op in self.schema.bounds:
            return _OPEN_BOUND[op.split("-")[0]]
        if op in ("ndim", "dim"):
            try:
                t = self.build(args[0], lhs=False)
            except ShapeError:
                raise _Fail(f"{to_text(args[0])} is ill-shaped") from None
            ax = self.eval(args[1]) if op == "dim" else None
            if ax is not None and not 0 <= ax < len(t.shape):
                raise _Fail(f"(dim {to_text(args[0])} {ax}) is undefined")
            return len(t.shape) if ax is None else t.shape[ax]
        v = [self.eval(a) for a in args]
        if op == "/" and v[1] == 0:
            raise _Fail("division by zero in a fact")
        ints = all(isinstance(y, int) for y in v)  # i64 division truncates towards zero
        if op == "%" and v[1] == 0:
            raise _Fail("remainder by zero in a fact")
        fns = {"+": lambda: v[0] + v[1], "-": lambda: v[0] - v[1], "*": lambda: v[0] * v[1],
               "%": lambda: math.fmod(v[0], v[1]) if not ints else
               int(math.copysign(abs(v[0]) % abs(v[1]), v[0])),
               "max": lambda: max(v), "min": lambda: min(v), "to-f64": lambda: float(v[0]),
               "vec-of": lambda: tuple(v), "/": lambda: (abs(v[0]) // abs(v[1]) * (
                   1 if (v[0] < 0) == (v[1] < 0) else -1)) if ints else v[0] / v[1]}
        if op not in fns:
            raise RuleError(f"unsupported primitive {op!r} in {to_text(x)}")
        return fns[op]()

    def fact(self, f: SList) -> None:
        """Check a :when fact (``=``, ``split`` may bind); _Fail if false, KeyError if unbound."""
        op, args = f.head(), f.items[1:]
        unbound = [a for a in args if _is_var(a) and str(a) not in self.env]
        if op == "=" and len(unbound) == 1 and len(args) == 2:
            self.env[str(unbound[0])] = self.eval(args[1] if args[0] is unbound[0] else args[0])
            return
        if op == "split":  # n = i * j with i, j >= 2; unbound i, j get a random factorization
            n, free = self.eval(args[0]), {str(u) for u in unbound}
            pairs = [(i, n // i) for i in range(2, n) if n % i == 0 and n // i >= 2 and all(
                str(a) in free or self.eval(a) == v for a, v in zip(args[1:], (i, n // i)))]
            if not pairs:
                raise _Fail(f"(split {n} {to_text(args[1])} {to_text(args[2])}) is false")
            for a, v in zip(args[1:], self.rng.choice(pairs)):
                self.env.setdefault(str(a), v)
            return
        if op == "is-op":  # where a boundary may go, not whether it is sound: any term will do
            return
        if op in self.schema.relations:  # a block-level fact: any value a file may add
            for a in unbound:
                self.env[str(a)] = self.drawn[str(a)] = self.rng.choice(_FACT_VALUES)
                self.facts.add(str(a))
            return
        a, b = (self.eval(x) for x in args)
        try:
            ok = {"=": a == b, "!=": a != b, ">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b}
        except TypeError:
            raise RuleError(f"ill-typed fact {to_text(f)}: {a!r} vs {b!r}") from None
        if op not in ok:
            raise RuleError(f"unsupported fact {to_text(f)}")
        if not ok[op]:
            for x, want in ((args[0], b), (args[1], a)):
                if op == "=" and isinstance(x, SList) and x.head() in ("ndim", "dim"):
                    self._want(x.items[1], self.eval(x.items[2]) if x.head() == "dim" else None,
                               want)
            raise _Fail(f"{to_text(f)} is false")

    def describe(self) -> str:
        """The bindings, e.g. ``a: (2, 3), ax=1``."""
        return ", ".join(f"{k}: {fmt_shape(v.shape)}" + (
            f" {v.dtype}" if v.dtype != "float32" else "") if isinstance(v, Node) else f"{k}={v}"
            for k, v in self.env.items())


def _thresholds(rule: Rule) -> tuple[int, ...]:
    """Sizes just above every number the rule writes between 1 and 64, on either side or in
    its :when facts (``6``, ``6.0``, ``6.5``), so a rule that holds only below some size
    (``(min n 6)``) meets instances above it."""
    found: list[int] = []

    def walk(x) -> None:
        if isinstance(x, SList | list):
            for y in (x.items if isinstance(x, SList) else x):
                walk(y)
        elif isinstance(x, str) and (n := _num(x)) is not None and 1 < n <= 64:
            found.append(math.floor(n))  # sizes past 6.0 or 6.5 too: 7 and up

    walk([rule.lhs, rule.rhs, rule.when])
    top = max(found, default=0)
    facts = any(isinstance(w, SList) and w.head() in Schema.load().relations for w in rule.when)
    extra = (4 * top,) if facts else ()  # a block rule's divisibility: a multiple of 1, 2, 4
    return (top + 1, top + 2, 2 * top + 1) + extra if found else ()


def _draw_shapes(names: list[str], rng: random.Random,
                 above: tuple[int, ...] = ()) -> dict[str, tuple]:
    """Random small shapes, from one of several tactics that make type-checking likely;
    ``above`` (sizes past the rule's thresholds) is one of the pools when given."""
    pools = _POOLS + ((above, above + (1, 2)) if above else ())
    pool, mode, ones = rng.choice(pools), rng.random(), rng.choice((0.0, 0.0, 0.2))
    r = rng.choice((2, 2, 3))  # free ranks 1..4, or one common rank r, or r and some r - 1
    ranks = {n: rng.randint(1, 4) if mode < 0.3 else r - (mode > 0.8 and rng.random() < 0.3)
             for n in names}
    return {n: tuple(1 if rng.random() < ones else rng.choice(pool) for _ in range(ranks[n]))
            for n in names}


_FEATURES, _PAST = 7, 4  # how many features an instance has; which says "past"


def _features(inst: _Instance, above: tuple[int, ...] = ()) -> set[tuple[int, bool]]:
    """Dims of 1, mixed ranks, non-powers of 2, every dim past the rule's thresholds (so
    every count made of them is: the reduced axis's, a product's), and the dtype: not
    float32, and bfloat16 (its 8-bit significand: a sum rounded before an exp is off by up
    to 28% there, within tolerance in float16 and float32, ``corners.tie_draws``)."""
    shapes = [v.shape for v in inst.inputs.values()]
    dims = {d for s in shapes for d in s}
    ints = [v for k, v in inst.env.items() if type(v) is int and v > 0 and k not in inst.drawn]
    past = bool(above) and min(dims, default=0) >= min(above)
    return set(enumerate((1 in dims, len({len(s) for s in shapes}) > 1,
                          any(d & (d - 1) for d in dims), any(v & (v - 1) for v in ints), past,
                          inst.dtype != "float32", inst.dtype == "bfloat16")))


def _instantiate(rule: Rule, inst: _Instance, repairs: int = 4,
                 redraws: int = _REDRAWS) -> tuple[_Instance, Node]:
    """Build the LHS and check the facts, repairing shapes a few times and drawing the
    values of block-level facts again (``redraws`` times: sizes that some loop range and
    part count divide, not the ones drawn, instantiate the rule); raise on failure.
    Facts go in any order (one may bind a variable another reads), and the LHS may compute
    a scalar from a variable only a fact binds (``(Const (* d 2.0))`` with ``(= d ...)``):
    it is built again once the facts have bound it."""
    while True:
        try:
            lhs, pending, unbound = None, list(rule.when), ""
            while lhs is None or pending:
                progress = False
                if lhs is None:
                    try:
                        lhs, progress = inst.build(rule.lhs, lhs=True), True
                    except KeyError as exc:  # a variable a fact may bind first
                        unbound = exc.args[0]
                left = []
                for f in pending:
                    try:
                        inst.fact(f)
                    except KeyError:
                        left.append(f)
                progress, pending = progress or len(left) < len(pending), left
                if not progress:
                    what = to_text(left[0]) if left else f"the left side ({unbound!r})"
                    raise _Fail(f"cannot evaluate {what}: unbound variables")
            return inst, lhs
        except (ShapeError, DTypeError, _Fail) as exc:
            if inst.repair is not None and repairs:
                inst, repairs = inst.repaired(), repairs - 1
            elif isinstance(exc, _Fail) and inst.facts and redraws:
                inst, redraws = inst.redrawn(), redraws - 1
            else:
                raise


def check_rule(rule: Rule, schema: Schema | None = None, instances: int = 3, seed: int = 0,
               trials: int = 3, max_attempts: int = 400, shape_instances: int = 40,
               deadline: Deadline | None = None) -> RuleCheck:
    """Check one directed rule; see ``check_rules``. Past ``deadline`` it stops with what it
    has (a rule with no verified instance then "cannot check")."""
    schema = schema or Schema.load()
    deadline = deadline or Deadline(None)
    rng = random.Random(f"{seed}:{rule.where}:{rule.name}")  # not the folder
    # the dtypes in a fixed cycle, started where the seed says: every rule meets each of
    # them within four attempts, so the chosen instances cover bfloat16 whatever the seed
    cycle = ("float32", "float16", "bfloat16", "float32")
    first = random.Random(f"{seed}:{rule.where}:{rule.name}:dtype").randrange(len(cycle))
    res = RuleCheck(rule.name, rule.where, "not instantiated", path=rule.path, line=rule.line)
    names = _tensor_vars(rule.lhs, schema, [])
    masks = frozenset(_mask_vars(rule.lhs, set()))
    indices = frozenset(_index_vars(rule.lhs, set()))
    ints = frozenset(_int_vars(rule.lhs, set()))
    above = _thresholds(rule)
    found, seen, why = [], set(), "no instance type-checked"  # found: (instance, lhs, rhs)
    for attempt in range(max_attempts):
        if len(found) >= shape_instances:  # enough right sides type-checked
            break
        if deadline.expired():
            why = "the time limit ran out"
            break
        try:
            dtype = cycle[(first + attempt) % len(cycle)]
            inst, lhs = _instantiate(rule, _Instance(schema, rng, _draw_shapes(names, rng, above),
                                                     masks=masks, dtype=dtype,
                                                     indices=indices, ints=ints))
        except (ShapeError, DTypeError, _Fail) as exc:
            why = f"last attempt: {exc}"
            continue
        except RuleError as exc:
            raise RuleError(f"{rule.path}:{rule.line}: {exc}") from None
        if inst.describe() in seen:
            continue
        seen.add(inst.describe())
        try:
            rhs = inst.build(rule.rhs, lhs=False)
            bad = "" if rhs.shape == lhs.shape else (
                f"the sides have different shapes, {fmt_shape(lhs.shape)} and "
                f"{fmt_shape(rhs.shape)}, for {inst.describe()}")
            if not bad and str(rhs.dtype) != str(lhs.dtype):  # another program, however
                bad = (f"the sides have different dtypes, {lhs.dtype} and {rhs.dtype}, for "
                       f"{inst.describe()}")  # close its values (em.verify says so too)
        except (ShapeError, DTypeError, TypeError) as exc:
            bad = (f"the right side is ill-shaped for {inst.describe()} (left side "
                   f"{fmt_shape(lhs.shape)}): {exc}")
        except _Fail as exc:  # e.g. a division by zero in a scalar the left side allows
            bad = f"the right side cannot be computed for {inst.describe()}: {exc}"
        except KeyError as exc:  # the parser refuses these; a variable bound nowhere
            raise RuleError(f"{rule.path}:{rule.line}: the right side reads {exc.args[0]!r}, "
                            "which neither the left side nor a :when fact binds") from None
        if bad:
            res.status, res.message = "unsound", bad
            return res
        found.append((inst, lhs, rhs))
    res.shape_instances = len(found)
    if not found:
        res.message = f"no instance in {max_attempts} attempts ({why})"
        return res
    chosen, covered, problems = [], set(), []
    while found and len(chosen) < instances:  # cover both values of every feature if we can
        gain = [len(new) + _FEATURES * ((_PAST, True) in new) for new in (  # past first
            _features(inst, above) - covered for inst, _, _ in found)]
        chosen.append(found.pop(gain.index(max(gain))))
        covered |= _features(chosen[-1][0], above)
    for k, (inst, lhs, rhs) in enumerate(chosen):
        graphs = [Graph(f"{side} of {rule.where}") for side in ("lhs", "rhs")]
        for g, node in zip(graphs, (lhs, rhs)):  # both declare every pattern tensor variable
            if node.op is Op.MASK:  # -inf where masked: compared through what consumes it
                node = make(Op.EXP, (node,))
            g.inputs, g.outputs = dict(inst.inputs), {"out": node}
        try:  # sound over the reals: the field trials and float64 (native dtypes below)
            v = verify(graphs[0], graphs[1], trials=trials, seed=seed * 1000 + k,
                       time_limit_s=deadline, native_check=False)
        except MirageError as exc:  # LaxError: e.g. an exp of an exp
            problems.append(f"{type(exc).__name__}: {exc}")
            continue
        if v.equivalent:
            res.instances += 1
            if res.float_safe is not False:
                unsafe = _float_unsafe(graphs[0], graphs[1], seed * 1000 + k)
                res.float_safe = unsafe is None
                if unsafe is not None:
                    res.float_message = f"for {inst.describe()}: {unsafe}"
        elif v.counterexample is not None:
            res.status, res.counterexample = "unsound", v.counterexample
            res.message = f"for {inst.describe()}: {v.reason}"
            return res
        else:
            problems.append(f"for {inst.describe()}: {v.reason}")
    res.status = "sound" if res.instances else "cannot check"
    res.message = "" if res.instances else "; ".join(problems[:2])
    return res


def _float_unsafe(lhs: Graph, rhs: Graph, seed: int) -> Counterexample | None:
    """Why the right side is unsafe in floating point where the left side is safe: the
    static checks and native-dtype draws of ``em.verify`` (docs/verifier.md, section 5)."""
    import numpy as np

    cex, _ = float_checks(lhs, rhs, np.random.default_rng([seed, 0xF1047]), 1e-7, True)
    return cex if cex is not None and cex.domain != "float64" else None


def check_rules(paths="rules", instances: int = 3, seed: int = 0,
                trials: int = 3, time_limit_s: float | Deadline | None = None
                ) -> RuleCheckReport:
    """Test every rule of the given rule files (or folders; "rules": the built-ins).

    Each directed rule (both directions of a birewrite) is instantiated with
    random shapes and values until its left side type-checks and its :when
    facts hold; every instance's right side must type-check to the same shape,
    and ``instances`` of them are compared with ``em.verify`` (``trials``
    finite-field trials plus a float check). Returns a ``RuleCheckReport``
    whose results have status "sound", "unsound" (with a counterexample or the
    ill-shaped instance), "not instantiated" or "cannot check" (never sound); a sound rule
    whose right side is unsafe in floating point where its left side is safe has
    ``float_safe`` False ("sound, float-unsafe", ``report.float_unsafe``).
    Malformed files raise ``RuleError`` naming the file and line. ``time_limit_s``
    (seconds or a ``Deadline``) bounds the whole check: rules not reached in time
    are "cannot check" ("the time limit ran out").
    """
    start = time.perf_counter()
    if not isinstance(time_limit_s, Deadline):
        check_seconds(time_limit_s, "check_rules")
    deadline = (time_limit_s if isinstance(time_limit_s, Deadline)
                else Deadline(time_limit_s, start))
    _, rules = load_rules([paths] if isinstance(paths, str | Path) else list(paths))
    schema = Schema.load()
    report = RuleCheckReport([check_rule(r, schema, instances, seed, trials, deadline=deadline)
                              for r in rules])
    report.seconds = time.perf_counter() - start
    return report


def assert_sound(paths="rules", instances: int = 3, seed: int = 0, trials: int = 3,
                 strict: bool = False, time_limit_s: float | Deadline | None = None,
                 allow_float_unsafe: bool = True) -> RuleCheckReport:
    """Run ``check_rules`` and raise ``RuleError`` listing every unsound rule.

    Each entry names the rule's file and line and gives its counterexample.
    With ``strict``, rules that could not be instantiated or checked are
    errors too (so is a rule the ``time_limit_s`` left unchecked); without
    ``allow_float_unsafe``, so are sound rules that are unsafe in floating point. Returns
    the report when nothing is wrong.
    """
    report = check_rules(paths, instances, seed, trials, time_limit_s)
    bad = [r for r in report.results
           if r.status == "unsound" or (strict and r.status != "sound")
           or (not allow_float_unsafe and r.status == "sound" and r.float_safe is False)]
    if bad:
        lines = [f"{printable(r.path)}:{r.line}: {r.verdict} rule {r.rule!r}: "
                 f"{printable(r.message or r.float_message)}" for r in bad]
        hint = ("" if all(r.status == "unsound" or r.float_safe is False for r in bad) else
                "\n(a rule that cannot be checked is refused; optimize(..., "
                "allow_unchecked_rules=True) loads it anyway)")
        if any(r.status == "sound" and r.float_safe is False for r in bad):
            hint += ("\n(a rule sound over the reals but unsafe in floating point is refused; "
                     "optimize(..., allow_float_unsafe_rules=True) loads it anyway)")
        raise RuleError(f"{len(bad)} rule(s) failed the soundness check:\n" + "\n".join(lines)
                        + hint)
    return report
