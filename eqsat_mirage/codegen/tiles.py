"""Tile ops of a custom kernel as Triton expressions: the blocks, padding and masks.

A tile is a Triton block: a tile dim of size 1 is dropped (``squeezed``), every
other dim of n elements becomes a block dim ``BLOCK_n``, n padded to a power of
two, and to >= 16 where it is an operand dim of a ``tl.dot``; ``mask_n =
tl.arange(0, BLOCK_n) < n`` marks the real elements. Loads fill padding with 0;
each value records whether its padding is still 0 (``Val.clean``: not after
``exp``, ``rsqrt``, a division or an added constant), and a value that is not is
masked with ``tl.where`` before a reduction or a ``tl.dot`` reads its padded
dim, so padding never reaches a real element. Broadcasting follows NumPy on the
logical shapes (``[:, None]`` where an operand lacks a dim); keepdims is free
(size-1 dims are not stored). Elementwise ops and reductions run in fp32;
``tl.dot`` reads its operands in the matmul's dtype (fp16/bf16 on tensor cores,
fp32 with ``input_precision="ieee"``; bf16 through the module constant ``BF16_DOT``, fp32
under the interpreter) and accumulates in fp32. A left operand whose batch dims the
right one lacks (attention's group of query heads against one key tile) has them merged
into M for one ``tl.dot`` of at least 16 rows (``dots.merges_batch``: only K and N are
padded to 16 there; the merge and the reshape back are row-major, so padded rows stay
where they were); any other tile matmul with M, K or N of 1, or with broadcast batch dims,
is a broadcast product summed over K. Constant subexpressions are folded to literals.

A concat of tiles is kept as its parts (``concat.py``). Refused
(``CodegenError``): a user reshape that splits or merges padded dims (one that only
adds or drops dims of size 1 is free, one over unpadded power-of-two dims is
``tl.reshape``), non-finite constants, blocks over 2**20 padded elements.
"""

from __future__ import annotations

import keyword
import math
import re

from ..ir.node import (
    BINARY,
    BIT_OPS,
    COMPARE,
    LOGIC,
    LOGIC_BINARY,
    REDUCE,
    Node,
    Op,
    Shape,
    fmt_shape,
    numel,
)
from ..ir.node import QUANT_DTYPES as INT_VALUES
from ..ir.ops import SPECS, ZERO
from ..mugraph.dots import MIN_DOT, matmul_dims, merges_batch, pow2, squeezed, uses_dot
from .concat import CodegenError, ConcatOps, Val

MAX_NUMEL = 2 ** 20  # Triton's largest block (TRITON_MAX_TENSOR_NUMEL)
TL_DTYPE = {"float16": "tl.float16", "bfloat16": "tl.bfloat16", "float32": "tl.float32",
            "bool": "tl.int1", "int8": "tl.int8", "uint8": "tl.uint8",
            "float8_e4m3fn": "tl.float8e4nv", "float8_e5m2": "tl.float8e5"}
# the dtype a bfloat16 tl.dot reads its operands in: a module constant, bfloat16 on a GPU and
# float32 under TRITON_INTERPRET=1 (Triton 3.8's interpreter multiplies the bit patterns of
# bfloat16 operands as integers in tl.dot); ``source.py`` defines it
BF16_DOT = "BF16_DOT"
_RESERVED = frozenset({"tl", "triton", "torch", "range", "float", "int", "min", "max", "len", "f",
                       "f_end", "n_iter", "seq_len", BF16_DOT})
MAX_IDENTIFIER = 64  # a generated identifier's longest wanted part (Triton names files by it)
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def identifier(text: str, prefix: str = "k") -> str:
    """``text`` made an ASCII Python identifier: characters outside ``[A-Za-z0-9_]`` become
    ``_``, cut to ``MAX_IDENTIFIER`` characters (its start and end); ``prefix_`` before one
    that starts with a digit, is a keyword or a dunder name. A user's name never reaches
    generated code any other way (``Names`` keeps the identifiers unique)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", str(text)) or prefix
    if len(name) > MAX_IDENTIFIER:  # the start and the end (a suffix such as _kernel, _ptr)
        name = name[:MAX_IDENTIFIER - 16] + name[-16:]
    if name[0].isdigit() or keyword.iskeyword(name) or name.startswith("__"):
        name = f"{prefix}_{name}"
    return name


def shown(name: str) -> str:
    """``name`` as a generated comment or docstring shows it: itself when it is a plain ASCII
    identifier of at most ``MAX_IDENTIFIER`` characters, otherwise its ``identifier`` form
    (at most 32 characters, then ``...``) in angle brackets. User text never reaches a
    comment or docstring as it was written: only string literals (``pystr``) hold it."""
    name = str(name)
    if len(name) <= MAX_IDENTIFIER and _PLAIN.match(name):
        return name
    text = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return f"<{text[:32]}{'...' if len(text) > 32 else ''}>"


def named(name: str) -> str:
    """A MuGraph's, graph's or size's name as a comment or docstring shows it: its ``repr``
    when it is plain (``shown``), else its ``shown`` form (no quote, no backslash)."""
    return repr(name) if shown(name) == name else shown(name)


_WORD = re.compile(r"\w+")


def comment_safe(text: str) -> str:
    """A generated comment's ``text`` with every word that is not plain (``shown``) replaced
    by its ``shown`` form and any character outside printable ASCII made ``?``: plain text is
    returned unchanged."""
    if text.isascii() and text.isprintable() and all(
            len(w) <= MAX_IDENTIFIER for w in _WORD.findall(text)):
        return text
    text = _WORD.sub(lambda m: m.group() if m.group().isascii() and len(m.group())
                     <= MAX_IDENTIFIER else shown(m.group()), text)
    return "".join(c if " " <= c <= "~" else "?" for c in text)


def pystr(text: str) -> str:
    """A Python string literal of ``text`` (``repr``; double quotes when ``text`` holds no
    quote, as the generated modules write their names)."""
    r = repr(str(text))
    if r.startswith("'") and '"' not in text and "'" not in text:
        r = f'"{r[1:-1]}"'
    return r


class Names:
    """Unique identifiers: the wanted name (made an ``identifier``), or that with a numeric
    suffix."""

    def __init__(self, reserved: frozenset[str] | set[str] = _RESERVED) -> None:
        self.used = set(reserved)

    def __call__(self, want: str) -> str:
        base = identifier(want, "v")
        name, i = base, 1
        while name in self.used:
            name, i = f"{base}_{i}", i + 1
        self.used.add(name)
        return name


def index(pos: int, rank: int) -> str:
    """The subscript putting a 1-d block at position ``pos`` of a rank-``rank`` block."""
    if rank <= 1:
        return ""
    return "[" + ", ".join(":" if i == pos else "None" for i in range(rank)) + "]"


LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)): the GPU's ex2 instruction
FOLD_MAX = 3.4028234663852886e38 / LOG2E / 2  # larger values: exp(x - m) is not folded


def exp2(expr: str) -> str:
    """``exp(expr)`` as Triton code: ``tl.exp2`` of the argument scaled by log2(e)."""
    simple = expr.isidentifier() or expr.replace("_", "").replace("-", "").isalnum()
    return f"tl.exp2({expr if simple else '(' + expr + ')'} * {LOG2E!r})"


_EXP_CALL = re.compile(r"(?<![\w.])exp\(")


def triton_form(template: str, x: str) -> str:
    """A spec's Triton form with the operand ``x``: ``{x}`` replaced, each ``exp(..)``
    written as ``exp2`` (``tl.exp2`` of its argument scaled by log2(e))."""
    m = _EXP_CALL.search(template)
    if m is None:
        return template.replace("{x}", x)
    depth, end = 1, m.end()
    while depth:
        depth += {"(": 1, ")": -1}.get(template[end], 0)
        end += 1
    inner = triton_form(template[m.end():end - 1], x)
    return template[:m.start()].replace("{x}", x) + exp2(inner) + triton_form(template[end:], x)


def literal(value: float, who: str) -> str:
    """A Python literal for a constant, refusing inf and nan."""
    if not math.isfinite(value):
        raise CodegenError(f"{who}: constant {value!r} is not finite")
    return repr(float(value))


class TileOps(ConcatOps):
    """Emits tile ops into lists of lines.

    ``block`` maps a tile dim size to its block size (the next power of two unless
    given); ``dot_sizes`` collects the sizes that a ``tl.dot`` reads, so a writer can
    pad those to 16 and emit again (``bumped``).
    """

    def __init__(self, who: str, names: Names, block: dict[int, int] | None = None) -> None:
        self.who, self.names, self.block = who, names, dict(block or {})
        self.block_name: dict[int, str] = {}
        self.dot_sizes: set[int] = set()
        self.masks: dict[int, str] = {}
        self.counter = 0
        self.listed: dict[int, str] = {}  # id(node) -> its name in the MuGraph listing
        # x - m with m broadcast (a row's maximum): exp of it is exp2(x*log2e - m*log2e),
        # log2(e) folded into one multiply-add per element (m scaled once per row)
        self.row_diffs: dict[str, tuple[str, str]] = {}
        # variables that may hold a value past FLT_MAX / log2(e) (computed from a constant
        # that large: a mask's fill of the dtype's lowest value): x*log2e would overflow to
        # -inf and exp(x - m) of a row filled with it would be NaN, so it is not folded
        self.huge: set[str] = set()
        self.env: dict[int, Val] = {}

    def bname(self, n: int) -> str:
        """The constexpr holding the block size of tile dims of ``n`` elements."""
        self.block.setdefault(n, pow2(n))
        if n not in self.block_name:
            self.block_name[n] = self.names(f"BLOCK_{n}")
        return self.block_name[n]

    def bumped(self) -> dict[int, int] | None:
        """Block sizes with every ``tl.dot`` dim padded to 16, or None if none needs it."""
        if all(self.block.get(n, pow2(n)) >= MIN_DOT for n in self.dot_sizes):
            return None
        return {**self.block, **{n: max(MIN_DOT, self.block.get(n, pow2(n)))
                                 for n in self.dot_sizes}}

    def padded(self, n: int) -> bool:
        self.bname(n)
        return self.block[n] > n

    def mask(self, n: int) -> str:
        if n not in self.masks:
            self.masks[n] = self.names(f"mask_{n}")
        return self.masks[n]

    def full_mask(self, dims: tuple[int, ...]) -> str | None:
        """The mask of a block with dims ``dims`` (None when no dim is padded)."""
        parts = [self.mask(n) + index(i, len(dims)) for i, n in enumerate(dims) if self.padded(n)]
        return " & ".join(parts) or None

    def blocks(self, dims: tuple[int, ...]) -> str:
        names = [self.bname(n) for n in dims]
        return "(" + ", ".join(names) + ("," if len(names) == 1 else "") + ")"

    def _check_numel(self, dims: tuple[int, ...], what: str) -> None:
        total = numel(tuple(self.block[n] for n in dims if self.bname(n)))
        if total > MAX_NUMEL:
            raise CodegenError(f"{self.who}: {what} is a block of {total} padded elements; "
                               f"Triton allows at most {MAX_NUMEL} (use smaller tiles)")

    # -- emitting ---------------------------------------------------------------------------
    def emit(self, section: list[str], var: str, expr: str, comment: str = "") -> None:
        section.append(f"{var} = {expr}" + (f"  # {comment}" if comment else ""))

    def label(self, node: Node) -> str:
        """``%3 = exp %2 : f32[8, 8]`` as in the MuGraph listing (same numbering)."""
        from ..ir.printing import op_attrs, short_dtype

        ops = ", ".join(self.listed.get(id(s), repr(s.arg)) for s in node.srcs)
        self.listed[id(node)] = f"%{self.counter}"
        self.counter += 1
        return f"{self.listed[id(node)]} = {node.op.name.lower()}{op_attrs(node)} {ops} : " \
               f"{short_dtype(node.dtype)}{list(node.shape)}"

    def f32(self, v: Val) -> str:
        if v.const is not None:
            return v.expr
        return v.expr if v.dtype == "float32" else f"{v.expr}.to(tl.float32)"

    def broadcast(self, expr: str, v: Val, out: Shape) -> str:
        """``expr`` (the block of ``v``) indexed to line up with a block of logical ``out``."""
        if v.const is not None or not v.dims:
            return expr
        r, ro = len(out), len(v.shape)
        idx = []
        for i, size in enumerate(out):
            if size > 1:
                j = i - (r - ro)
                idx.append(":" if j >= 0 and v.shape[j] > 1 else "None")
        if idx.count(":") != len(v.dims):
            raise CodegenError(f"{self.who}: internal: cannot broadcast {fmt_shape(v.shape)} to "
                               f"{fmt_shape(out)}")
        return expr if "None" not in idx else f"{expr}[{', '.join(idx)}]"

    def materialize(self, v: Val, shape: Shape) -> str:
        """An expression for ``v`` as a block of logical ``shape`` (a constant: ``tl.full``)."""
        if v.const is None:
            return v.expr
        return f"tl.full({self.blocks(squeezed(shape))}, {v.expr}, tl.float32)"

    def node(self, node: Node, env: dict[int, Val], section: list[str]) -> Val:
        """Emit tile op ``node`` (operands in ``env``) into ``section``; returns its value."""
        srcs = [env[id(s)] for s in node.srcs]
        self.env = env  # split_node reads the operands that broadcast along a concat axis
        if node.op is Op.CONST:
            return Val(literal(node.arg, self.who), (), "float32", False, float(node.arg))
        if node.op is Op.CAUSAL:  # no operands, yet no constant: a mask from positions
            return self.causal_mask(node, section)
        label = self.label(node)
        if all(s.const is not None for s in srcs):
            return self._fold(node, srcs)
        if node.op is Op.CONCAT:
            return self.concat(node, srcs, section, label)
        if node.op is Op.SLICE:
            return self.slice_parts(node, srcs[0], label)
        if any(s.parts for s in srcs):
            return self.split_op(node, srcs, section, label)
        return self.op(node, srcs, section, label, f"v{self.counter - 1}")

    def op(self, node: Node, srcs: list[Val], section: list[str], label: str, var: str) -> Val:
        """Emit ``node`` on operand values ``srcs`` (no concat parts) as variable ``var``."""
        self._check_numel(squeezed(node.shape), f"{node.describe()} {fmt_shape(node.shape)}")
        var = self.names(var)
        big = any(x.expr in self.huge or (x.const is not None and abs(x.const) > FOLD_MAX)
                  for x in srcs)
        if big:
            self.huge.add(var)
        if node.op in BINARY:
            expr, clean = self._binary(node, srcs)
            if node.op is Op.SUB and srcs[1].const is None and srcs[0].const is None and \
                    len(srcs[1].dims) < len(srcs[0].dims) and not big:
                a, b = (self.broadcast(self.f32(x), x, node.shape) for x in srcs)
                self.row_diffs[var] = (a, b)
        elif node.op in (Op.WHERE, Op.MASK):
            expr, clean = self._select(node, srcs)
        elif node.op is Op.MATMUL:
            expr, clean = self._matmul(node, srcs[0], srcs[1])
        elif node.op in REDUCE:
            expr, clean = self._reduce(node, srcs[0])
        elif node.op in (Op.TRANSPOSE, Op.RESHAPE):
            expr, clean = self._movement(node, srcs[0]), srcs[0].clean
            self.emit(section, var, expr, label)
            return Val(var, node.shape, srcs[0].dtype, clean)
        elif node.op in LOGIC_BINARY:  # a and b, a or b of int1 blocks: an int1 block (its
            a, b = (self.broadcast(s.expr, s, node.shape) for s in srcs)  # padding may hold)
            self.emit(section, var, f"{a} {SPECS[node.op].symbol} {b}", label)
            return Val(var, node.shape, "bool", False)
        elif node.op in LOGIC:  # a bool mask's not: an int1 block (its padding now holds)
            self.emit(section, var, triton_form(SPECS[node.op].triton, srcs[0].expr), label)
            return Val(var, node.shape, "bool", False)
        elif node.op in COMPARE:  # an int1 block in registers, compared in float32 (exact
            a, b = (self.broadcast(self.f32(s), s, node.shape) for s in srcs)  # on the
            self.emit(section, var, f"{a} {SPECS[node.op].symbol} {b}", label)  # operands)
            return Val(var, node.shape, "bool", False)
        else:
            expr, clean = self._unary(node, srcs[0])
        self.emit(section, var, expr, label)
        return Val(var, node.shape, "float32", clean)

    def causal_mask(self, node: Node, section: list[str]) -> Val:
        """A causal mask block op (the tile is the whole mask: a schedule that splits it is
        refused when it is lowered): ``row + offset >= col`` from the block's positions."""
        rows, cols, off = node.arg
        if node.shape != (rows, cols):
            raise CodegenError(f"{self.who}: internal: causal mask {rows}x{cols} as a tile of "
                               f"{fmt_shape(node.shape)}")
        if getattr(self, "family", False):  # its offset and sizes follow L: read, not fused
            raise CodegenError(f"{self.who}: a causal or length mask computed inside a shape "
                               "family's kernel")
        label = self.label(node)
        dims = squeezed(node.shape)
        if not dims:  # one element: a constant
            value = 1.0 if off >= 0 else 0.0
            return Val(literal(value, self.who), (), "float32", False, value)
        pos, r = [], 0
        for size in node.shape:
            if size > 1:
                pos.append(f"tl.arange(0, {self.bname(size)}){index(r, len(dims))}")
                r += 1
            else:
                pos.append("0")
        var = self.names(f"v{self.counter - 1}")
        self.emit(section, var, f"{pos[0]} + {off} >= {pos[1]}", label)
        return Val(var, node.shape, "bool", False)

    def _fold(self, node: Node, srcs: list[Val]) -> Val:
        """An op on constants folded to one: every folded value is a scalar (a tile op on
        scalars is one; a broadcast of one value is taken once)."""
        import numpy as np

        from ..semantics.floating import FLOAT_SEMANTICS, FloatCtx, uniform

        value = FLOAT_SEMANTICS[node.op](FloatCtx({}, None), node,
                                         *(np.float64(s.const) for s in srcs))
        if not uniform(value):
            raise CodegenError(f"{self.who}: internal: {node.describe()} of constants is not "
                               f"one value ({fmt_shape(np.shape(value))})")
        value = float(np.asarray(value).reshape(-1)[0])
        return Val(literal(value, self.who), (), "float32", False, value)

    def _unary(self, node: Node, x: Val) -> tuple[str, bool]:
        """An elementwise unary op: its spec's Triton form; the padding stays clean
        (zero) where the spec says the op keeps zero."""
        a = self.f32(x)
        op, spec = node.op, SPECS[node.op]
        if op is Op.EXP and x.expr in self.row_diffs:
            xa, m = self.row_diffs[x.expr]  # exp(x - m) = exp2(x*log2e - m*log2e): one FMA
            return f"tl.exp2({xa} * {LOG2E!r} - {m} * {LOG2E!r})", False
        if op is Op.CAST and node.arg in INT_VALUES:  # int8 <-> uint8 wraps (bits kept)
            return f"{x.expr}.to({TL_DTYPE[node.arg]}).to(tl.float32)", x.clean
        if op is Op.CAST:  # tiles compute in fp32: a cast to a half type rounds there
            if node.arg == "float32":
                return a, x.clean
            return f"{a}.to({TL_DTYPE[node.arg]}).to(tl.float32)", x.clean
        if op in BIT_OPS:  # x & mask, x >> shift on the integer tile (a uint8 load: zero-
            # extended, int8: sign-extended, so >> is arithmetic), exact in float32 after
            form = spec.triton.format(x=f"{x.expr}.to(tl.int32)", arg=node.arg)
            return f"({form}).to(tl.float32)", x.clean
        if spec.triton is None:
            raise CodegenError(f"{self.who}: {node.describe()} has no Triton form")
        return triton_form(spec.triton, a), x.clean and spec.padding.zero == ZERO

    def _binary(self, node: Node, srcs: list[Val]) -> tuple[str, bool]:
        sym = SPECS[node.op].symbol
        a, b = (self.broadcast(self.f32(s), s, node.shape) for s in srcs)
        pad = {n for n in squeezed(node.shape) if self.padded(n)}
        tiles = [s for s in srcs if s.const is None]
        covered = set().union(*(set(s.dims) for s in tiles)) >= pad
        if node.op in (Op.ADD, Op.SUB):
            clean = all((s.const == 0.0) if s.const is not None else
                        (s.clean and set(s.dims) >= pad) for s in srcs)
        elif node.op is Op.MUL:
            clean = all(s.clean for s in tiles) and covered
        else:  # padding divided by padding gives nan; only a nonzero constant keeps it 0
            clean = srcs[1].const not in (None, 0.0) and srcs[0].clean and covered
        return f"{a} {sym} {b}", clean

    def _select(self, node: Node, srcs: list[Val]) -> tuple[str, bool]:
        """where(c, a, b) / mask(c, x): ``tl.where`` on the mask (an int1 tile)."""
        c = self.broadcast(srcs[0].expr, srcs[0], node.shape)
        vals = [self.broadcast(self.f32(s), s, node.shape) for s in srcs[1:]]
        fill = vals[1] if node.op is Op.WHERE else "-float('inf')"
        return f"tl.where({c} != 0, {vals[0]}, {fill})", False

    def _where(self, expr: str, mask: str | None, fill: str = "0.0") -> str:
        return expr if mask is None else f"tl.where({mask}, {expr}, {fill})"

    def _matmul(self, node: Node, a: Val, b: Val) -> tuple[str, bool]:
        batch, m, kk, n = matmul_dims(node)
        if a.const is not None or b.const is not None:
            raise CodegenError(f"{self.who}: {node.describe()} of a constant")
        clean = a.clean and b.clean

        k_pos = (len(squeezed(a.shape[:-1])), len(squeezed(b.shape[:-2])))

        def k_mask(v: Val, pos: int) -> str | None:  # zero v's padded K unless already zero
            if v.clean or kk < 2 or not self.padded(kk):
                return None
            return self.mask(kk) + index(pos, len(v.dims))

        dot = uses_dot(node)
        merge = not dot and merges_batch(node)
        if dot or merge:
            self.dot_sizes.update((kk, n) if merge else (m, kk, n))
            want = BF16_DOT if node.dtype == "bfloat16" else TL_DTYPE[node.dtype]
            ops = []
            for v, pos in zip((a, b), k_pos):
                expr = self._where(v.expr, k_mask(v, pos))
                same = v.dtype == node.dtype and want != BF16_DOT
                ops.append(expr if same else f"{expr}.to({want})")
            prec = ', input_precision="ieee"' if node.dtype == "float32" else ""
            if not merge:
                return f"tl.dot({ops[0]}, {ops[1]}{prec})", clean
            rows = " * ".join(self.bname(d) for d in a.dims[:-1])
            flat = f"tl.reshape({ops[0]}, ({rows}, {self.bname(kk)}))"
            return (f"tl.reshape(tl.dot({flat}, {ops[1]}{prec}), "
                    f"{self.blocks(squeezed(node.shape))})"), clean
        # a broadcast product over (batch..., M, K, N), summed over K
        nb = len(batch)
        ws = tuple(batch) + (m, kk, n)
        self._check_numel(squeezed(ws), f"{node.describe()} (broadcast product)")

        def place(v: Val, slots: list[int], pos: int) -> str:
            expr = self._where(self.f32(v), k_mask(v, pos))
            have = {s for s, size in zip(slots, v.shape) if size > 1}
            idx = [":" if p in have else "None" for p in range(len(ws)) if ws[p] > 1]
            return expr if "None" not in idx else f"{expr}[{', '.join(idx)}]"

        def slots(v: Val, last: tuple[int, int]) -> list[int]:
            return [nb - (len(v.shape) - 2) + j for j in range(len(v.shape) - 2)] + list(last)

        prod = (f"{place(a, slots(a, (nb, nb + 1)), k_pos[0])} * "
                f"{place(b, slots(b, (nb + 1, nb + 2)), k_pos[1])}")
        if kk < 2:
            return prod, clean
        return f"tl.sum({prod}, axis={len(squeezed(ws[:nb + 1]))})", clean

    def _reduce(self, node: Node, x: Val) -> tuple[str, bool]:
        axes, _ = node.arg
        src = node.srcs[0].shape
        pos = [len(squeezed(src[:a])) for a in axes if src[a] > 1]
        expr, clean = self.f32(x), x.clean
        big = node.op is Op.MAX  # padding must not win a max: it reads as -inf
        if pos and (big or not x.clean) and any(self.padded(src[a]) for a in axes if src[a] > 1):
            expr = self._where(expr, self.full_mask(x.dims), "-float('inf')" if big else "0.0")
            clean = not big
        nan = f"tl.where({expr} == {expr}, 0.0, {expr})"  # NaN where the operand is, else 0
        for p in sorted(pos, reverse=True):
            expr = f"tl.{'max' if big else 'sum'}({expr}, axis={p})"
            nan = f"tl.sum({nan}, axis={p})"
        if big and pos:  # tl.max skips NaN (maxnum); torch's max of a row with a NaN is NaN
            expr = f"({expr} + {nan})"
        if node.op is Op.MEAN:
            count = numel(tuple(src[a] for a in axes))
            expr = f"{expr} / {float(count)!r}" if count > 1 else expr
        return expr, clean

    def _movement(self, node: Node, x: Val) -> str:
        src = node.srcs[0].shape
        if node.op is Op.RESHAPE:
            if squeezed(src) == squeezed(node.shape):  # only dims of size 1 come or go
                return x.expr
            if any(self.padded(n) for n in squeezed(src) + squeezed(node.shape)):
                raise CodegenError(
                    f"{self.who}: {node.describe()} {fmt_shape(src)} -> "
                    f"{fmt_shape(node.shape)} splits or merges tile dims that are padded (to a "
                    "power of two, or to 16 for tl.dot); the Triton backend reshapes only "
                    "unpadded tiles")
            return f"tl.reshape({x.expr}, {self.blocks(squeezed(node.shape))})"
        where = {a: len(squeezed(src[:a])) for a in range(len(src)) if src[a] > 1}
        perm = [where[a] for i, a in enumerate(node.arg) if node.shape[i] > 1]
        if perm == sorted(perm):
            return x.expr
        if len(perm) == 2:
            return f"tl.trans({x.expr})"
        return f"tl.permute({x.expr}, {tuple(perm)})"
