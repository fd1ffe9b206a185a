"""Rule files: parse egglog-syntax rewrite rules, check them against the schema.

A rule file holds ``(ruleset NAME)`` declarations and ``(rewrite LHS RHS
[:when (FACTS)] [:ruleset NAME])`` / ``(birewrite ...)`` forms, each preceded
by a one-line ``;`` comment that becomes its description, and facts of the block
level: ``(loop-range 16)``, ``(split-parts 8)``, ``(block-range 32 4096)`` (a relation of
rules/schema.egg over integer literals) and ``(set (max-loop-range) 16)`` (a bound; the
schema's merge keeps the tightest of all files). Every constructor a
rule names must exist in rules/schema.egg with the right arity; a malformed
file gets a ``RuleError`` naming the file and line. A line ``(op-rules FAMILY)``
stands for rules generated from the ops' specs (egraph/op_rules.py): in a rule
file the ``dev`` and ``reg`` rewrites, in rules/schema.egg and rules/guards.egg (egglog
read as it is) the ``shape``, ``is-op`` and ``absval`` rules.
"""

from __future__ import annotations

import functools
import math
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from ..ir.errors import RuleError
from .op_rules import FAMILIES, op_rules, written_out

# Primitive functions and relations a rule may use in conditions and computed arguments
# (``is-op``: the term is computed by an operation; rules/schema.egg).
PRIMITIVES = {"+", "-", "*", "/", "%", "max", "min", "to-f64", "vec-of", "=", "!=", ">=", "<=",
              ">", "<", "ndim", "dim", "split", "is-op"}


class Sym(str):
    """An atom of an s-expression (a symbol or a number)."""


@dataclass
class SList:
    """A parenthesised s-expression with the line it starts on."""

    items: list
    line: int

    def head(self) -> str | None:
        """The first item when it is a symbol."""
        return self.items[0] if self.items and isinstance(self.items[0], Sym) else None


def parse_sexprs(text: str, path: str) -> list[tuple[SList, str]]:
    """Parse ``text`` into top-level lists, each with the ``;`` comment just above it."""
    tokens = re.finditer(r'\(|\)|"(?:[^"\\]|\\.)*"|;[^\n]*|[^\s()";]+|\n', text)
    line, stack, out, comment, pending = 1, [], [], "", ""
    for m in tokens:
        tok = m.group(0)
        if tok == "\n":
            line += 1
            if not stack:
                comment, pending = pending, ""
            continue
        if tok.startswith(";"):
            if not stack:
                pending = tok.lstrip("; ").strip()
            continue
        if tok == "(":
            stack.append(SList([], line))
        elif tok == ")":
            if not stack:
                raise RuleError(f"{path}:{line}: unbalanced ')'")
            done = stack.pop()
            if stack:
                stack[-1].items.append(done)
            else:
                out.append((done, comment or pending))
                comment, pending = "", ""
        else:
            if not stack:
                raise RuleError(f"{path}:{line}: stray atom {tok!r} outside a form")
            stack[-1].items.append(tok if tok.startswith('"') else Sym(tok))
    if stack:
        raise RuleError(f"{path}:{stack[-1].line}: unclosed '(' (file ends inside this form)")
    return out


def to_text(x) -> str:
    """Print an s-expression back in egglog syntax."""
    if isinstance(x, SList):
        return "(" + " ".join(to_text(i) for i in x.items) + ")"
    return str(x)


@dataclass(frozen=True)
class Schema:
    """Constructors of sort T: name -> argument sorts (``Kern``, declared with
    ``constructor``, included); ``others``: the constructors of the other sorts (the block
    level's Loop, Split, Schedule): name -> (argument sorts, sort); ``relations``: name ->
    argument sorts; ``bounds``: the zero-argument i64 functions a fact may set
    (``min-loop-range``, ``max-loop-range``)."""

    constructors: dict[str, tuple[str, ...]]
    others: dict[str, tuple[tuple[str, ...], str]] = field(default_factory=dict)
    relations: dict[str, tuple[str, ...]] = field(default_factory=dict)
    bounds: frozenset = frozenset()

    @classmethod
    @functools.cache
    def load(cls) -> Schema:
        """Read rules/schema.egg (once per process: it is package data); its declarations,
        not the rules its ``(op-rules ...)`` lines stand for."""
        text = (builtin_rules_dir() / "schema.egg").read_text()
        ctors: dict[str, tuple[str, ...]] = {}
        others: dict[str, tuple[tuple[str, ...], str]] = {}
        relations: dict[str, tuple[str, ...]] = {}
        bounds: set[str] = set()
        for form, _ in parse_sexprs(text, "schema.egg"):
            head = form.head()
            if head == "datatype":
                for c in form.items[2:]:
                    sorts = tuple(str(s) for s in c.items[1:])
                    if form.items[1] == "T":
                        ctors[str(c.items[0])] = sorts
                    else:
                        others[str(c.items[0])] = (sorts, str(form.items[1]))
            elif head == "constructor" and form.items[3] == "T":
                ctors[str(form.items[1])] = tuple(str(s) for s in form.items[2].items)
            elif head == "relation":
                relations[str(form.items[1])] = tuple(str(s) for s in form.items[2].items)
            elif head == "function" and not form.items[2].items and form.items[3] == "i64":
                bounds.add(str(form.items[1]))
        return cls(ctors, others, relations, frozenset(bounds))


@dataclass(frozen=True)
class Fact:
    """A fact of a rule file: ``(loop-range 16)`` (a relation over integer literals) or
    ``(set (max-loop-range) 16)`` (a bound; the schema's merge keeps the tightest)."""

    relation: str
    args: tuple[int, ...]
    path: str = ""
    line: int = 0
    bound: bool = False  # a (set (f) v) form

    def egglog(self) -> str:
        """The fact as one egglog command."""
        if self.bound:
            return f"(set ({self.relation}) {self.args[0]})"
        return f"({self.relation} {' '.join(map(str, self.args))})"


@dataclass
class Rule:
    """One directed rewrite rule, as read from a file."""

    name: str
    lhs: SList
    rhs: SList | Sym
    when: list = field(default_factory=list)
    ruleset: str = "user"
    path: str = ""
    line: int = 0

    @property
    def where(self) -> str:
        """``file:line`` of the rule."""
        return f"{os.path.basename(self.path)}:{self.line}"

    def variables(self) -> set[str]:
        """Pattern variables bound by the left-hand side."""
        return _vars(self.lhs)

    def egglog(self, guard_facts: list[str] = ()) -> str:
        """The rule as one egglog ``rewrite`` command."""
        facts = [to_text(w) for w in self.when] + list(guard_facts)
        when = f" :when ({' '.join(facts)})" if facts else ""
        return f"(rewrite {to_text(self.lhs)} {to_text(self.rhs)}{when} :ruleset {self.ruleset})"


def _vars(x) -> set[str]:
    if isinstance(x, SList):
        out: set[str] = set()
        for item in x.items[1:]:
            out |= _vars(item)
        return out
    if isinstance(x, Sym) and re.fullmatch(r"[a-z_][a-z0-9_]*", x):
        return {str(x)}
    return set()


def _is_pattern_var(x) -> bool:
    """Whether ``x`` is a bare symbol (a pattern variable), not a literal or a term."""
    return isinstance(x, str) and not x.startswith('"') and not _F64.fullmatch(x)


def _check_term(x, schema: Schema, path: str, line: int) -> None:
    if not isinstance(x, SList):
        return
    head = x.head()
    line = x.line or line
    if head is None:
        raise RuleError(f"{path}:{line}: expected an operator at the start of {to_text(x)}")
    sorts = schema.constructors.get(head) or schema.others.get(head, ((),))[0]
    if head in schema.constructors or head in schema.others:
        want = len(sorts)
        if len(x.items) - 1 != want:
            raise RuleError(f"{path}:{line}: {head} takes {want} arguments, got "
                            f"{len(x.items) - 1} in {to_text(x)}")
        for k, (sort, item) in enumerate(zip(sorts, x.items[1:])):
            literal = isinstance(item, str) and item.startswith('"')
            if literal != (sort == "String") and (literal or not _is_pattern_var(item)):
                got = f"the string literal {item}" if literal else to_text(item)
                raise RuleError(f"{path}:{line}: {head} argument {k + 1} is a {sort}, got "
                                f"{got} in {to_text(x)}")
    elif head not in PRIMITIVES and head not in schema.relations and head not in schema.bounds:
        known = ", ".join(sorted(schema.constructors))
        raise RuleError(f"{path}:{line}: unknown constructor {head!r} in {to_text(x)} "
                        f"(the schema has: {known})")
    for item in x.items[1:]:
        _check_term(item, schema, path, line)


_FACTS = {"=", "!=", ">=", "<=", ">", "<", "is-op", "split"}  # and the schema's relations
_ARITH = {"+", "-", "*", "/", "%", "max", "min"}
_I64 = re.compile(r"-?\d+")
_F64 = re.compile(r"-?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?")
INTERNAL_RULESETS = ("shapes", "absrules", "axioms", "reach")  # schema.egg and guards.egg


def _sort(x, schema: Schema, where: str) -> str | None:
    """The sort of a term ("i64", "f64", "T", ...), None for a pattern variable; raises a
    ``RuleError`` for a literal out of range, a division by a literal zero or mixed sorts."""
    if not isinstance(x, SList):
        if _I64.fullmatch(x):
            if not -2**63 <= int(x) < 2**63:
                raise RuleError(f"{where}: integer literal {x} is out of the i64 range")
            return "i64"
        if _F64.fullmatch(x):
            if not math.isfinite(float(x)):
                raise RuleError(f"{where}: float literal {x} is not a finite f64")
            return "f64"
        return None
    head, args = x.head(), x.items[1:]
    if head in schema.constructors:
        for a, want in zip(args, schema.constructors[head]):
            got = _sort(a, schema, where)
            if got is not None and got != want:
                raise RuleError(f"{where}: {head} takes {want} here, got {got} {to_text(a)} "
                                f"in {to_text(x)}")
        return "T"
    if head in schema.others:
        for a, want in zip(args, schema.others[head][0]):
            got = _sort(a, schema, where)
            if got is not None and got != want:
                raise RuleError(f"{where}: {head} takes {want} here, got {got} {to_text(a)} "
                                f"in {to_text(x)}")
        return schema.others[head][1]
    sorts = [_sort(a, schema, where) for a in args]
    if head in ("ndim", "dim") or head in schema.bounds:
        return "i64"
    if head == "to-f64":
        return "f64"
    if head in ("/", "%") and len(args) == 2 and not isinstance(args[1], SList) and sorts[1] \
            and float(args[1]) == 0.0:
        raise RuleError(f"{where}: division by zero in {to_text(x)}")
    known = {s for s in sorts if s is not None}
    if head in _ARITH | _FACTS - {"is-op", "split"} and len(known) > 1:
        raise RuleError(f"{where}: {to_text(x)} mixes sorts {' and '.join(sorted(known))} "
                        "(write 2 for an i64, 2.0 for an f64)")
    return known.pop() if head in _ARITH and known else None


def _check_facts(when: list, schema: Schema, where: str) -> None:
    """Every :when fact is a comparison or relation over well-sorted terms."""
    for fact in when:
        if not isinstance(fact, SList) or (fact.head() not in _FACTS
                                           and fact.head() not in schema.relations):
            raise RuleError(f"{where}: a :when fact must be a comparison such as "
                            f"(= (ndim a) 2) or (is-op a), got {to_text(fact)}")


def _fact(form: SList, schema: Schema, path: str) -> Fact | None:
    """``form`` as a fact of the block level (None when it is not one); ``RuleError`` when
    it names a relation or bound with arguments other than integer literals."""
    head, args = form.head(), form.items[1:]
    if head == "set" and len(args) == 2 and isinstance(args[0], SList) \
            and args[0].head() in schema.bounds and not args[0].items[1:]:
        name, args, bound = str(args[0].head()), args[1:], True
    elif head in schema.relations and head != "is-op":
        name, bound = str(head), False
        if len(args) != len(schema.relations[head]):
            raise RuleError(f"{path}:{form.line}: {head} takes {len(schema.relations[head])} "
                            f"arguments, got {len(args)} in {to_text(form)}")
    else:
        return None
    if not all(isinstance(a, str) and _I64.fullmatch(a) and int(a) >= 1 for a in args):
        raise RuleError(f"{path}:{form.line}: a fact takes positive integer literals, got "
                        f"{to_text(form)}")
    return Fact(name, tuple(int(a) for a in args), path, form.line, bound)


def _with_line(x, line: int):
    """``x`` with every list's line set to ``line`` (a generated rule's: its op-rules')."""
    if isinstance(x, SList):
        x.line = line
        for item in x.items:
            _with_line(item, line)
    return x


def _forms(text: str, path: str, schema: Schema) -> list[tuple[SList, str]]:
    """A rule file's top-level forms and comments, each ``(op-rules FAMILY)`` written out
    as the rewrites it stands for, on the op-rules line."""
    out: list[tuple[SList, str]] = []
    for form, comment in parse_sexprs(text, path):
        if form.head() != "op-rules":
            out.append((form, comment))
            continue
        family = str(form.items[1]) if len(form.items) == 2 else ""
        if not FAMILIES.get(family, ("", False))[1]:
            kinds = ", ".join(f for f, (_, rewrites) in FAMILIES.items() if rewrites)
            raise RuleError(f"{path}:{form.line}: a rule file's (op-rules FAMILY) takes one of "
                            f"{kinds}, got {to_text(form)}")
        out += [(_with_line(f, form.line), c)
                for f, c in parse_sexprs(op_rules(family, schema.constructors), path)]
    return out


def parse_rules(text: str, path: str, schema: Schema | None = None) -> tuple[list[str], list[Rule]]:
    """Parse a rule file's text: (rulesets declared, rules). Raises ``RuleError``."""
    rulesets, rules, _ = parse_rule_file(text, path, schema)
    return rulesets, rules


def parse_rule_file(text: str, path: str, schema: Schema | None = None
                    ) -> tuple[list[str], list[Rule], list[Fact]]:
    """Parse a rule file's text: (rulesets declared, rules, facts). Raises ``RuleError``."""
    schema = schema or Schema.load()
    rulesets: list[str] = []
    rules: list[Rule] = []
    facts: list[Fact] = []
    for form, comment in _forms(text, path, schema):
        head = form.head()
        fact = _fact(form, schema, path)
        if fact is not None:
            facts.append(fact)
            continue
        if head == "ruleset":
            if len(form.items) != 2:
                raise RuleError(f"{path}:{form.line}: (ruleset NAME) takes one name")
            rulesets.append(str(form.items[1]))
            continue
        if head not in ("rewrite", "birewrite"):
            raise RuleError(f"{path}:{form.line}: expected (rewrite ...), (birewrite ...), "
                            f"(ruleset ...) or a fact such as (loop-range 16), got ({head} ...)")
        if len(form.items) < 3:
            raise RuleError(f"{path}:{form.line}: {head} needs a left and a right side")
        lhs, rhs, opts = form.items[1], form.items[2], form.items[3:]
        when, ruleset = [], "user"
        for i in range(0, len(opts), 2):
            key = opts[i]
            if i + 1 >= len(opts):
                raise RuleError(f"{path}:{form.line}: option {key} has no value")
            if key == ":when":
                if not isinstance(opts[i + 1], SList):
                    raise RuleError(f"{path}:{form.line}: :when takes a list of facts")
                when = opts[i + 1].items
            elif key == ":ruleset":
                ruleset = str(opts[i + 1])
            else:
                raise RuleError(f"{path}:{form.line}: unknown option {key}")
        if not isinstance(lhs, SList) or lhs.head() not in schema.constructors:
            raise RuleError(f"{path}:{form.line}: the left side must be a constructor pattern, "
                            f"got {to_text(lhs)}")
        for part in (lhs, rhs, *when):
            _check_term(part, schema, path, form.line)
        _check_facts(when, schema, f"{path}:{form.line}")
        for part in (lhs, rhs, *when):
            _sort(part, schema, f"{path}:{getattr(part, 'line', 0) or form.line}")
        name = comment or f"{os.path.basename(path)}:{form.line}"
        rule = Rule(name, lhs, rhs, when, ruleset, path, form.line)
        bound = rule.variables() | _vars(SList([Sym("when"), *when], 0))
        free = _vars(rhs) - bound
        if free:
            raise RuleError(f"{path}:{form.line}: right side uses unbound variables "
                            f"{sorted(free)}")
        rules.append(rule)
        if head == "birewrite":
            if not isinstance(rhs, SList) or rhs.head() not in schema.constructors:
                raise RuleError(f"{path}:{form.line}: birewrite needs a constructor on both sides")
            back = Rule(name + " (reversed)", rhs, lhs, when, ruleset, path, form.line)
            if _vars(lhs) - back.variables() - _vars(SList([Sym("when"), *when], 0)):
                raise RuleError(f"{path}:{form.line}: birewrite's right side must bind every "
                                "variable of its left side")
            rules.append(back)
    for rule in rules:
        if rule.ruleset not in rulesets:
            raise RuleError(f"{rule.path}:{rule.line}: ruleset {rule.ruleset!r} is not declared "
                            f"in this file (add (ruleset {rule.ruleset}))")
    return rulesets, rules, facts


def builtin_rules_dir() -> Path:
    """The folder of the built-in rule files: the source tree's beside this package when it
    has one (a checkout, or a worktree of one, reads its own rules), else the package data."""
    tree = Path(__file__).resolve().parents[2] / "rules"
    if (tree / "schema.egg").exists():
        return tree
    try:
        path = Path(str(resources.files("eqsat_mirage.rules")))
        if (path / "schema.egg").exists():
            return path
    except (ModuleNotFoundError, TypeError):
        pass
    return Path(__file__).resolve().parents[2] / "rules"


def _expanded(name: str) -> str:
    """The built-in egglog file ``name`` with its ``(op-rules FAMILY)`` lines written out."""
    path = builtin_rules_dir() / name
    return written_out(path.read_text(), Schema.load().constructors, str(path))


@functools.cache
def schema_text() -> str:
    """The egglog text of rules/schema.egg with its generated rules (once per process)."""
    return _expanded("schema.egg")


@functools.cache
def guards_text() -> str:
    """The egglog text of rules/guards.egg with its generated rules (once per process)."""
    return _expanded("guards.egg")


def rule_paths(specs) -> list[Path]:
    """Expand rule specs (files, folders, or "rules" for the built-ins) into files.

    A single string or path is one spec (``rules="my.egg"``), not a sequence of letters.
    """
    if isinstance(specs, str | os.PathLike):
        specs = [specs]
    out: list[Path] = []
    for spec in specs:
        path = builtin_rules_dir() if str(spec) == "rules" else Path(spec)
        if path.is_dir():
            out.extend(p for p in sorted(path.glob("*.egg")) if p.name not in
                       ("schema.egg", "guards.egg"))
        elif path.is_file():
            out.append(path)
        else:
            raise RuleError(f"{spec}: no such rule file or folder")
    return out


def load_rules(specs=("rules",)) -> tuple[list[str], list[Rule]]:
    """Load and check every rule file named by ``specs``; rulesets and rules in order."""
    rulesets, rules, _ = load_rule_files(specs)
    return rulesets, rules


def load_facts(specs=("rules",)) -> list[Fact]:
    """The facts of every rule file named by ``specs`` (``(loop-range 16)``, ...), in order."""
    return load_rule_files(specs)[2]


def load_rule_files(specs=("rules",)) -> tuple[list[str], list[Rule], list[Fact]]:
    """Load and check every rule file named by ``specs``: rulesets, rules and facts."""
    schema = Schema.load()
    facts: list[Fact] = []
    rulesets: list[str] = []
    rules: list[Rule] = []
    builtin, paths = builtin_rules_dir(), rule_paths(specs)
    reserved = {r: "an internal ruleset" for r in INTERNAL_RULESETS}
    for f in paths:  # a user file may replace a built-in ruleset only if that file is left out
        if f.parent == builtin:
            for m in re.finditer(r"^\(ruleset\s+([^\s()]+)\)", f.read_text(), re.M):
                reserved[m.group(1)] = f"declared by the built-in {f.name}, loaded with it"
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise RuleError(f"{path}: cannot read ({exc.strerror})") from None
        except UnicodeDecodeError as exc:
            line = path.read_bytes()[:exc.start].count(b"\n") + 1
            raise RuleError(f"{path}:{line}: not UTF-8 text (byte {exc.object[exc.start]:#04x} "
                            f"at offset {exc.start})") from None
        rs, rl, fs = parse_rule_file(text, str(path), schema)
        facts += fs
        if path.parent != builtin:
            for r in rs:
                if r in reserved:
                    line = text[:text.find(f"(ruleset {r}")].count("\n") + 1
                    raise RuleError(f"{path}:{line}: ruleset {r!r} is {reserved[r]}; name "
                                    "yours differently (or leave that built-in file out to "
                                    "replace it)")
        rulesets += [r for r in rs if r not in rulesets]
        rules += rl
    return rulesets, rules, facts
