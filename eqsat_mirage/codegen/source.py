"""Lowering a MuGraph to Triton: one Python module, and that module compiled to a callable.

``triton_source(mg, header, reuse_outputs)`` returns the source of one Python module:

- a header comment: the MuGraph's listing, and ``header`` (e.g. the predicted cost);
- ``INPUTS`` / ``OUTPUTS``: name -> (shape, torch dtype); ``REUSE_OUTPUTS``;
- one ``@triton.jit`` kernel per custom kernel (``kernel.py``), its strides ``tl.constexpr``;
- ``run(*tensors, **by_name)``: checks the inputs once per input signature (a
  ``ValueError`` naming the input, expected and actual shape, dtype or device),
  allocates every kernel output (or, with ``REUSE_OUTPUTS``, takes the buffers kept
  for that signature), runs the kernels in order (pre-defined kernels as torch ops,
  custom kernels as Triton launches over their grid) and returns ``{output name:
  tensor}``. The launcher's runtime (``_bind``, ``_check``, strides, buffers): ``host.py``.

A shape family's module (``family=``) names its size in ``INPUTS`` and reads L from the
inputs (its ``FamilyLayout``: ``family_layout.py``; the launcher lines that read and
check L: ``family_launch.py``); the family stage merges it, written at several padded
sizes, into one module whose launcher computes grids, loop counts and shapes from L
(``family/launcher.py``).

``compile_mugraph(mg)`` writes that module to a file (``@triton.jit`` reads its
function's source), imports it and returns its ``run`` (``runtime.load.load_source``, which
also loads a source already written). On a machine without a
GPU, set ``TRITON_INTERPRET=1`` before triton is imported: the same kernels then
run in Triton's interpreter on CPU tensors.

The generated code uses only the ``tl`` functions in ``TRITON_API`` (all present
in Triton 3.6, the GPU machines' version); ``TRITON_DENYLIST`` names newer or
experimental APIs it must never emit.
"""

from __future__ import annotations

import builtins
import io
import os
import textwrap
import tokenize
from collections.abc import Callable, Mapping

from ..ir.node import BINARY, BIT_OPS, COMPARE, LOGIC, UNARY, Node, Op
from ..ir.ops import SPECS
from ..ir.printing import short_dtype
from ..mugraph.io import format_mugraph
from ..mugraph.kernels import CustomKernel, PredefinedKernel, TensorSpec
from ..mugraph.program import MuGraph
from ..runtime.load import load_source
from .concat import CodegenError
from .family_launch import cut_to_length, family_head, family_run
from .family_layout import FamilyLayout
from .host import (
    TAKE_ALONG,
    bf16_dot_lines,
    bind_source,
    contiguous_strides,
    take_along_lines,
    unpack,
)
from .kernel import KernelWriter, fit, wrap
from .tiles import BF16_DOT, Names, comment_safe, identifier, literal, named, pystr, shown

__all__ = ["CodegenError", "compile_mugraph", "triton_source", "TRITON_API",
           "TRITON_DENYLIST"]

# Every ``tl.<name>`` the generator may emit: long-standing APIs, all in Triton 3.6.
TRITON_API = frozenset({
    "program_id", "arange", "load", "store", "dot", "sum", "max", "exp", "exp2", "sqrt", "rsqrt",
    "maximum", "PropagateNan", "abs", "erf", "cos", "sin",
    "where", "zeros", "full", "trans", "permute", "reshape", "constexpr", "float16", "bfloat16",
    "float32",
})
# Newer, experimental or tuning-only APIs that generated code must not contain (absent in
# Triton 3.6, or unstable across versions); ``TRITON_API`` is the positive list.
TRITON_DENYLIST = ("tl.make_tensor_descriptor", "TensorDescriptor", "_experimental",
                   "tl.make_block_ptr", "tl.advance", "tl.dot_scaled", "tl.gather", "tl.range",
                   "tl.static_range", "tl.multiple_of", "tl.max_contiguous", "tl.cat",
                   "tl.join", "tl.split", "tl.histogram", "tl.inline_asm", "tl.extra",
                   "libdevice", "triton.knobs", "triton.tools")

HELD_SIZES = 4  # a shape family's reused buffers: padded sizes kept (REUSE_OUTPUTS)
TORCH_DTYPE = {"float16": "torch.float16", "bfloat16": "torch.bfloat16",
               "float32": "torch.float32", "bool": "torch.bool", "int64": "torch.int64",
               "int32": "torch.int32", "int8": "torch.int8", "uint8": "torch.uint8",
               "float8_e4m3fn": "torch.float8_e4m3fn", "float8_e5m2": "torch.float8_e5m2"}
_HOST_RESERVED = frozenset({"torch", "triton", "tl", "os", "device", "args", "kwargs", "run",
                            "entry", "key", "tensors", "INPUTS", "OUTPUTS", "NEEDS_TRITON",
                            "REUSE_OUTPUTS", "_bind", "_check", "_signature", "_buffers",
                            "_CHECKED", "SIZE", "GRANULE", "LENGTHS", "HINT", "PADDED", "SHORT",
                            "seq_len", "lp", "held", "_held", "_", "f", "builtins"}
                           | set(dir(builtins)) | {BF16_DOT, TAKE_ALONG})


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _specs(table: dict[str, TensorSpec], axes: Mapping[str, set] | None = None,
           size: str = "") -> list[str]:
    """``INPUTS``/``OUTPUTS`` entries; ``axes``: a family's tensor -> its axes of size
    ``size``, shown by that name."""
    axes = axes or {}
    out = []
    for n, s in table.items():
        shape = tuple(repr(size) if a in axes.get(n, ()) else d for a, d in enumerate(s.shape))
        out.append(f'    {pystr(n)}: ({_shape(shape)}, {TORCH_DTYPE[s.dtype]}),')
    return out


def _torch_op(k: PredefinedKernel, var: dict[str, str], length_mask: bool = False) -> str:
    """The torch expression of a pre-defined kernel (its operands are device tensors);
    ``length_mask``: a shape family's length mask (True where ``col < seq_len``)."""
    n, who = k.node, f"kernel {k.name!r}"

    def arg(s: Node, cast: bool = False) -> str:
        if s.op is Op.CONST:
            return literal(s.arg, who)
        x = var[s.arg]
        return f"{x}.to({TORCH_DTYPE[n.dtype]})" if cast and s.dtype != n.dtype else x

    if n.op is Op.CAUSAL:
        rows, cols, off = n.arg
        off = "seq_len - 1" if length_mask else off
        return f"torch.ones(({rows}, {cols}), dtype=torch.bool, device=device).tril({off})"
    if all(s.op is Op.CONST for s in n.srcs):
        from ..frontend.graph import Graph
        from ..semantics.floating import evaluate

        frag = Graph(k.name)
        frag.outputs = {"y": n}
        value = float(evaluate(frag, {})["y"].reshape(-1)[0])
        return f"torch.full({_shape(n.shape)}, {literal(value, who)}, " \
               f"dtype={TORCH_DTYPE[n.dtype]}, device=device)"
    op, xs = n.op, n.srcs
    spec = SPECS[op]
    if op in BIT_OPS:  # x & mask, x >> shift: the constant second
        return f"{spec.torch}({arg(xs[0])}, {n.arg})"
    if op in UNARY | LOGIC and op is not Op.CAST:  # elementwise: their specs' torch functions
        return f"{spec.torch}({', '.join(arg(x) for x in xs)})"  # (logical and, or: two)
    if op in BINARY | COMPARE:  # a comparison: a bool tensor
        a, b, sym = arg(xs[0]), arg(xs[1]), spec.symbol
        if xs[1].op is Op.CONST and b.startswith("-"):
            b = f"({b})"
        return f"{a} {sym} {b}"
    if op is Op.MATMUL:
        return f"torch.matmul({arg(xs[0], True)}, {arg(xs[1], True)})"
    if op in (Op.SUM, Op.MEAN, Op.MAX):
        axes, keep = n.arg
        if not axes:
            return f"{arg(xs[0])}.clone()"
        return f"{spec.torch}({arg(xs[0])}, dim={_shape(axes)}, keepdim={bool(keep)})"
    if op is Op.TRANSPOSE:
        return f"{arg(xs[0])}.permute{_shape(n.arg)}"
    if op is Op.RESHAPE:
        return f"{arg(xs[0])}.reshape({_shape(n.arg)})"
    if op is Op.CAST:
        return f"{arg(xs[0])}.to({TORCH_DTYPE[n.arg]})"
    if op is Op.SLICE:
        axis, start, stop = n.arg
        return f"{arg(xs[0])}.narrow({axis}, {start}, {stop - start}).contiguous()"
    if op is Op.CONCAT:
        return f"torch.cat([{', '.join(arg(s, True) for s in xs)}], dim={n.arg})"
    if op is Op.WHERE:
        return f"torch.where({arg(xs[0])}, {arg(xs[1], True)}, {arg(xs[2], True)})"
    if op is Op.MASK:
        return f"torch.where({arg(xs[0])}, {arg(xs[1], True)}, float('-inf'))"
    if op is Op.GATHER:  # torch checks the indices (IndexError; on a GPU a device assert)
        return f"torch.index_select({arg(xs[0])}, {n.arg}, {arg(xs[1])}.reshape(-1))" \
               f".reshape({_shape(n.shape)})"
    if op is Op.TAKE_ALONG_AXIS:  # torch.gather, its indices checked as a gather's
        return f"{TAKE_ALONG}({arg(xs[0])}, {n.arg}, {arg(xs[1])})"
    raise CodegenError(f"{who}: {n.describe()} has no torch form")


def _alloc(spec: TensorSpec, first: tuple[str, str] | None) -> str:
    """Allocation of a tensor a kernel writes: ``first`` is the first input's (variable,
    dtype), whose ``new_empty`` is the cheapest way to a tensor on its device."""
    if first is None:
        return f"torch.empty({_shape(spec.shape)}, dtype={TORCH_DTYPE[spec.dtype]}, " \
               "device=device)"
    dtype = "" if spec.dtype == first[1] else f", dtype={TORCH_DTYPE[spec.dtype]}"
    return f"{first[0]}.new_empty({_shape(spec.shape)}{dtype})"


class _Launcher:
    """What ``triton_source`` writes a module from: the MuGraph, its custom kernels' writers,
    and the launcher's variable names and strides (taken in the order the module shows them).

    Each method returns one part of the module's lines, in the order they are written:
    ``globals``, ``definitions``, ``run_head``, ``kernel_calls``, ``result``.
    """

    def __init__(self, mg: MuGraph, reuse_outputs: bool, length_masks: frozenset[str],
                 family: FamilyLayout | None) -> None:
        self.mg, self.reuse, self.family = mg, reuse_outputs, family
        self.length_masks = length_masks
        specs = self.specs = mg.tensors
        self.custom = [k for k in mg.kernels if isinstance(k, CustomKernel)]
        fn_names = Names(set(_HOST_RESERVED))
        causal = {k.output: k.node.arg for k in mg.kernels  # masks computed from positions
                  if k.kind == "predefined" and k.node.op is Op.CAUSAL}
        for t in length_masks:
            rows, cols, _ = causal[t]
            causal[t] = (rows, cols, "(seq_len - 1)")
        self.writers = {id(k): KernelWriter.write(
            k, specs, fn_names(f"{identifier(k.name)}_kernel"), causal, family)
            for k in self.custom}
        self.dyn = {n: tuple(sorted(family.inputs[n])) for n in mg.inputs
                    if family and family.inputs.get(n)}
        host = self.host = Names(fn_names.used)
        var = self.var = {name: host(name) for name in specs}
        names = self.names = list(mg.inputs)
        # the kernels' constexpr strides: an input's from its signature's entry, a torch op's
        # result's asked once, and literals for the contiguous tensors the launcher allocates
        self.strides = {n: [host(f"{var[n]}_s{d}") for d in range(len(specs[n].shape))]
                        for n in names}
        self.written = {t: spec for k in self.custom for t, spec in k.output_specs().items()}
        self.strides.update({t: [str(s) for s in contiguous_strides(spec.shape)]
                             for t, spec in self.written.items()})
        self.pointed = {t for k in self.custom for t in self.writers[id(k)].reads}
        self.first = (var[names[0]], specs[names[0]].dtype) if names else None
        self.grows = dict(family.tensors) if family else {}
        self.out_axes = {o: self.grows.get(t, ()) for o, t in mg.output_tensors.items()}
        self.buffers = [var[t] for t in self.written] if reuse_outputs else []

    def globals(self) -> list[str]:
        """The imports, ``INPUTS``, ``OUTPUTS``, ``NEEDS_TRITON``, the family's constants and
        ``REUSE_OUTPUTS``."""
        mg, specs, custom, family = self.mg, self.specs, self.custom, self.family
        lines = ["", "import os", "", "import torch"]
        lines += ["import triton", "import triton.language as tl"] if custom else []
        lines += bf16_dot_lines() if any(BF16_DOT in self.writers[id(k)].text
                                         for k in custom) else []
        size = family.name if family else ""
        lines += (["", "INPUTS = {"] + _specs({n: specs[n] for n in mg.inputs}, self.grows, size)
                  + ["}"])
        lines += ["OUTPUTS = {"] + _specs(mg.outputs, self.out_axes, size) + ["}"]
        lines += [f"NEEDS_TRITON = {bool(custom)}",
                  *(family_head(family, self.dyn) if family else []),
                  f"REUSE_OUTPUTS = {bool(self.reuse)}  # "
                  + ("outputs allocated once per input signature, overwritten by the next call"
                     if self.reuse else "every call allocates its outputs")]
        return lines

    def definitions(self) -> list[str]:
        """The ``@triton.jit`` kernels, ``_take_along`` where a kernel is a take_along_axis,
        ``_bind`` (with ``_check``) and, reusing outputs, ``_buffers``."""
        var, names, specs, family = self.var, self.names, self.specs, self.family
        lines = []
        for k in self.custom:
            lines += ["", "", self.writers[id(k)].text.rstrip("\n")]
        if any(k.kind == "predefined" and k.node.op is Op.TAKE_ALONG_AXIS
               for k in self.mg.kernels):
            lines += take_along_lines()
        lines += ["", "", bind_source([var[n] for n in names], self.reuse, {
            names.index(n): (len(specs[n].shape), axes) for n, axes in self.dyn.items()}
        ).rstrip("\n")]
        if self.reuse:
            params = ", ".join(["device"] + (["lp"] if family else []) + [var[n] for n in names])
            lines += ["", "", f"def _buffers({params}):",
                      '    """The tensors the kernels write, allocated once per input signature '
                      + ("and padded size " if family else "") + "(REUSE_OUTPUTS):\n    every "
                      'call with that signature writes and returns these same tensors."""']
            lines += [f"    {var[t]} = {_alloc(spec, self.first)}"
                      for t, spec in self.written.items()]
            buffers = self.buffers
            lines.append(f"    return ({', '.join(buffers)}{',' if len(buffers) == 1 else ''})")
        return lines

    def run_doc(self) -> list[str]:
        """The lines of ``run``'s docstring below its first line."""
        mg, family = self.mg, self.family
        outs = ", ".join(shown(o) for o in mg.output_tensors)
        doc = textwrap.wrap(f"Inputs {', '.join(shown(n) for n in self.names) or '(none)'}: "
                            "torch tensors by position, by "
                            f"name, or as one dict. Returns a dict of torch tensors: {outs}.", 92)
        if family:
            doc += textwrap.wrap(f"A shape family: the axes named {named(family.name)} in INPUTS "
                                 "may have any length (they must agree); the outputs' axes named "
                                 "so are cut to it.", 92)
        if self.reuse:
            doc += textwrap.wrap("REUSE_OUTPUTS: the tensors returned are the same at every call "
                                 "with the same input signature" + (
                                     f" and padded size (the buffers of {HELD_SIZES} padded sizes "
                                     "are kept; a new one after that starts afresh)"
                                     if family else "") + ", overwritten by the next call "
                                 "(clone() them to keep them).", 92)
        return doc

    def run_head(self) -> list[str]:
        """``def run``, its docstring, the call to ``_bind`` unpacking the inputs and their
        signature's entry, and a family's lines that read L and take its buffers."""
        mg, var, names, family, dyn = self.mg, self.var, self.names, self.family, self.dyn
        lines = ["", "", "def run(*args, **kwargs):", f'    """Run MuGraph {named(mg.name)}.', ""]
        lines += [f"    {line}" for line in self.run_doc()] + ['    """']
        ins = "(" + ", ".join(var[n] for n in names) + ("," if len(names) == 1 else "") + ")"
        ins = ins if names else "_"
        held = ["_held"] if self.reuse and family else self.buffers
        entry = ["device"] + [s if n in self.pointed and n not in dyn else "_" for n in names
                              for s in self.strides[n]] + held
        one = (f"    {ins}, ({', '.join(entry)}{',' if len(entry) == 1 else ''}) "
               "= _bind(args, kwargs)")
        if len(one) <= 100:
            lines.append(one)
        elif len(f"    {ins}, entry = _bind(args, kwargs)") <= 100:
            lines += [f"    {ins}, entry = _bind(args, kwargs)"] + unpack(entry, "entry")
        else:
            lines += ["    tensors, entry = _bind(args, kwargs)"]
            lines += unpack([var[n] for n in names], "tensors") + unpack(entry, "entry")
        if family:
            lines += family_run(family, dyn, var, self.pointed, self.strides,
                                {n: len(self.specs[n].shape) for n in dyn})
            if self.reuse:
                lines += ["    held = _held.get(lp)", "    if held is None:",
                          f"        if len(_held) >= {HELD_SIZES}:  # padded sizes whose buffers "
                          "are kept",
                          "            _held.clear()",
                          f"        held = _held[lp] = _buffers(device, lp, "
                          f"{', '.join(var[n] for n in names)})"]
                lines += unpack(self.buffers, "held") if self.buffers else []
        return lines

    def kernel_calls(self) -> list[str]:
        """``run``'s body after binding: each kernel in order, a pre-defined one as a torch
        expression, a custom one as a Triton launch (after allocating what it writes)."""
        mg, specs, var, dyn = self.mg, self.specs, self.var, self.dyn
        read = mg.materialized()
        # a family's comments show sizes at this module's padded size (any dynamic axis's)
        at = "".join(f" at lp = {specs[n].shape[axes[0]]}" for n, axes in list(dyn.items())[:1])
        lines = []
        for k in mg.kernels:
            if isinstance(k, PredefinedKernel):
                lines += self._torch_call(k, read, at)
                continue
            grid = ", ".join(str(g) for g in k.grid)
            lines += [f"    # {line}" for line in textwrap.wrap(
                f"kernel {shown(k.name)}: custom, grid ({grid}), forloop {k.forloop}{at}"
                + (" (into reused buffers)" if self.reuse else ""), 94)]
            if not self.reuse:
                lines += [f"    {var[t]} = {_alloc(spec, self.first)}"
                          for t, spec in k.output_specs().items()]
            lines += ["    " + line for line in self.writers[id(k)].launch(var, self.strides)]
        return lines

    def _torch_call(self, k: PredefinedKernel, read: set, at: str) -> list[str]:
        """A pre-defined kernel's line (and its result's strides when a kernel reads it), or a
        comment for a causal mask computed inside the kernels."""
        n, var = k.node, self.var
        if n.op is Op.CAUSAL and k.output not in read:
            return [f"    # {line}" for line in textwrap.wrap(
                f"kernel {shown(k.name)}: causal mask {list(n.shape)}{at}, computed from "
                "positions inside the kernels that use it", 94)]
        lines = fit([f"{var[k.output]} = {_torch_op(k, var, k.output in self.length_masks)}  "
                     f"# kernel {shown(k.name)}: {n.op.name.lower()} -> {short_dtype(n.dtype)}"
                     f"{list(n.shape)}{at}"], "    ")
        if k.output in self.pointed and n.shape:  # a torch op's result: any strides
            self.strides[k.output] = [self.host(f"{var[k.output]}_s{d}")
                                      for d in range(len(n.shape))]
            lines += unpack(self.strides[k.output], f"{var[k.output]}.stride()")
        return lines

    def result(self) -> list[str]:
        """``run``'s return: the outputs by name (a family's cut to L)."""
        result = [f'{pystr(o)}: {cut_to_length(self.var[t], self.out_axes[o])}'
                  for o, t in self.mg.output_tensors.items()]
        ret = wrap(result, "    ", ",")
        if len(ret) == 1:
            return [f"    return {{{ret[0].strip().rstrip(',')}}}"]
        return ["    return {"] + ["    " + r for r in ret] + ["    }"]


def _header_lines(mg: MuGraph, n_custom: int, header: str) -> list[str]:
    """The module's header comment: its kernels, ``header`` and the MuGraph's listing."""
    lines = [f"# Generated by eqsat-mirage from MuGraph {named(mg.name)}: {len(mg.kernels)} "
             "kernel(s),",
             f"# {n_custom} custom (Triton), {len(mg.kernels) - n_custom} pre-defined "
             "(torch)."]
    if header.strip():
        lines += ["#"] + [comment_safe(f"# {line}".rstrip())
                          for line in header.strip().splitlines()]
    listing = format_mugraph(mg, shown(mg.name))
    return lines + ["#"] + [comment_safe(f"# {line}") for line in listing.splitlines()]


def triton_source(mugraph: MuGraph, header: str = "", reuse_outputs: bool = False,
                  length_masks: frozenset[str] = frozenset(),
                  family: FamilyLayout | None = None) -> str:
    """The Python module (source text) running ``mugraph`` with Triton kernels and torch.

    ``header`` (e.g. the predicted cost) is added to the module's header comment.
    ``reuse_outputs``: the tensors the Triton kernels write (outputs and intermediates) are
    allocated once per input signature and reused by every later call with it, so a call's
    outputs are overwritten by the next call (``REUSE_OUTPUTS = True`` in the module; see
    ``host.py``). Raises ``CodegenError`` for a block graph the backend cannot lower.
    ``family``: the ``FamilyLayout`` of a shape family's plan (``mugraph`` at one padded
    size): the launcher reads L from its inputs (``seq_len``), rounds it up to the padded
    size ``lp``, zero-pads the inputs a torch op reads, passes L, strides and loop counts
    to the kernels as runtime arguments (their source is the same at every padded size)
    and cuts the outputs to L. ``length_masks``: the family's length masks (True where
    ``col < L``), computed from ``seq_len``. ``family.launcher.family_source`` merges such
    modules into one serving every padded size.
    """
    mg = mugraph.validate()
    launcher = _Launcher(mg, reuse_outputs, length_masks, family)
    lines = _header_lines(mg, len(launcher.custom), header)
    lines += launcher.globals() + launcher.definitions()
    lines += launcher.run_head() + launcher.kernel_calls() + launcher.result()
    return safe_comments("\n".join(lines) + "\n")


def safe_comments(source: str) -> str:
    """``source`` with every comment made ``comment_safe`` (plain comments are kept as they
    are): a name that reached a comment shows as its ``shown`` form."""
    lines = source.splitlines(keepends=True)
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (SyntaxError, tokenize.TokenError):
        return source  # load_source names a generator bug
    for tok in reversed(tokens):
        if tok.type == tokenize.COMMENT and comment_safe(tok.string) != tok.string:
            row, col = tok.start
            line = lines[row - 1]
            end = len(line.rstrip("\r\n"))
            lines[row - 1] = line[:col] + comment_safe(tok.string) + line[end:]
    return "".join(lines)


def compile_mugraph(mugraph: MuGraph, header: str = "",
                    directory: str | os.PathLike | None = None,
                    reuse_outputs: bool = False,
                    length_masks: frozenset[str] = frozenset(),
                    family: FamilyLayout | None = None) -> Callable:
    """Generate, write and import the module of ``mugraph``; returns its ``run``.

    ``run(*tensors, **by_name)`` takes torch tensors (positionally in input order, by
    name, or one dict) and returns ``{output name: tensor}``. With ``reuse_outputs``
    those tensors (and the intermediates between kernels) are allocated once per input
    signature and returned again by every later call with it: the next call overwrites
    them, so ``clone()`` what must be kept (off by default). The module is written to
    ``directory`` (default: a private per-user folder in the system's temp directory, see
    ``runtime.load.private_folder``) under a name derived from its content; ``run.source`` and
    ``run.path`` give the text and the file. ``length_masks`` and ``family``: see
    ``triton_source``.
    Triton is imported here: on a CPU, set ``TRITON_INTERPRET=1`` before that.
    """
    source = triton_source(mugraph, header, reuse_outputs, length_masks, family)
    return load_source(source, directory)
