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

``compile_mugraph(mg)`` writes that module to a file (``@triton.jit`` reads its
function's source), imports it and returns its ``run``. On a machine without a
GPU, set ``TRITON_INTERPRET=1`` before triton is imported: the same kernels then
run in Triton's interpreter on CPU tensors.

The generated code uses only the ``tl`` functions in ``TRITON_API`` (all present
in Triton 3.6, the GPU machines' version); ``TRITON_DENYLIST`` names newer or
experimental APIs it must never emit.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
import tempfile
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from ..ir.node import BINARY, Node, Op
from ..ir.printing import _short
from ..mugraph.kernels import CustomKernel, PredefinedKernel, TensorSpec
from ..mugraph.program import MuGraph
from .concat import CodegenError
from .host import bind_source, contiguous_strides, unpack
from .kernel import KernelWriter, fit, wrap
from .tiles import Names, identifier, literal

__all__ = ["CodegenError", "compile_mugraph", "triton_source", "TRITON_API", "TRITON_DENYLIST"]

# Every ``tl.<name>`` the generator may emit: long-standing APIs, all in Triton 3.6.
TRITON_API = frozenset({
    "program_id", "arange", "load", "store", "dot", "sum", "max", "exp", "exp2", "sqrt", "rsqrt",
    "maximum", "erf", "cos", "sin",
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

TORCH_DTYPE = {"float16": "torch.float16", "bfloat16": "torch.bfloat16",
               "float32": "torch.float32", "bool": "torch.bool"}
_HOST_RESERVED = frozenset({"torch", "triton", "tl", "os", "device", "args", "kwargs", "run",
                            "entry", "key", "tensors", "INPUTS", "OUTPUTS", "NEEDS_TRITON",
                            "REUSE_OUTPUTS", "_bind", "_check", "_signature", "_buffers",
                            "_CHECKED"})


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _specs(table: dict[str, TensorSpec]) -> list[str]:
    return [f'    "{n}": ({_shape(s.shape)}, {TORCH_DTYPE[s.dtype]}),' for n, s in table.items()]


def _torch_op(k: PredefinedKernel, var: dict[str, str]) -> str:
    """The torch expression of a pre-defined kernel (its operands are device tensors)."""
    n, who = k.node, f"kernel {k.name!r}"

    def arg(s: Node, cast: bool = False) -> str:
        if s.op is Op.CONST:
            return literal(s.arg, who)
        x = var[s.arg]
        return f"{x}.to({TORCH_DTYPE[n.dtype]})" if cast and s.dtype != n.dtype else x

    if n.op is Op.CAUSAL:
        rows, cols, off = n.arg
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
    unary = {Op.NEG: "torch.neg", Op.EXP: "torch.exp", Op.SQRT: "torch.sqrt",
             Op.RSQRT: "torch.rsqrt", Op.SILU: "torch.nn.functional.silu", Op.RELU: "torch.relu",
             Op.TANH: "torch.tanh", Op.ERF: "torch.erf", Op.COS: "torch.cos",
             Op.SIN: "torch.sin"}
    if op in unary:
        return f"{unary[op]}({arg(xs[0])})"
    if op in BINARY:
        a, b = arg(xs[0]), arg(xs[1])
        sym = {Op.ADD: "+", Op.SUB: "-", Op.MUL: "*", Op.DIV: "/"}[op]
        if xs[1].op is Op.CONST and b.startswith("-"):
            b = f"({b})"
        return f"{a} {sym} {b}"
    if op is Op.MATMUL:
        return f"torch.matmul({arg(xs[0], True)}, {arg(xs[1], True)})"
    if op in (Op.SUM, Op.MEAN, Op.MAX):
        axes, keep = n.arg
        if not axes:
            return f"{arg(xs[0])}.clone()"
        fn = {Op.SUM: "torch.sum", Op.MEAN: "torch.mean", Op.MAX: "torch.amax"}[op]
        return f"{fn}({arg(xs[0])}, dim={_shape(axes)}, keepdim={bool(keep)})"
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
    raise CodegenError(f"{who}: {n.describe()} has no torch form")


def _alloc(spec: TensorSpec, first: tuple[str, str] | None) -> str:
    """Allocation of a tensor a kernel writes: ``first`` is the first input's (variable,
    dtype), whose ``new_empty`` is the cheapest way to a tensor on its device."""
    if first is None:
        return f"torch.empty({_shape(spec.shape)}, dtype={TORCH_DTYPE[spec.dtype]}, " \
               "device=device)"
    dtype = "" if spec.dtype == first[1] else f", dtype={TORCH_DTYPE[spec.dtype]}"
    return f"{first[0]}.new_empty({_shape(spec.shape)}{dtype})"


def triton_source(mugraph: MuGraph, header: str = "", reuse_outputs: bool = False,
                  length_masks: frozenset[str] = frozenset(),
                  family: tuple[Mapping[str, set], frozenset[str], frozenset[str]] | None = None
                  ) -> str:
    """The Python module (source text) running ``mugraph`` with Triton kernels and torch.

    ``header`` (e.g. the predicted cost) is added to the module's header comment.
    ``reuse_outputs``: the tensors the Triton kernels write (outputs and intermediates) are
    allocated once per input signature and reused by every later call with it, so a call's
    outputs are overwritten by the next call (``REUSE_OUTPUTS = True`` in the module; see
    ``host.py``). Raises ``CodegenError`` for a block graph the backend cannot lower.
    ``length_masks``: causal mask tensors that are a shape family's length masks (True
    where ``col < L``): the kernels take L as the runtime argument ``seq_len`` (the module's
    ``SEQ_LEN``, set by the family's runner before each call), so one build serves every L.
    ``family``: ({tensor: dynamic axes}, kernels whose loop grows, inputs read unpadded)
    of a shape family's plan: those tensors' strides and those loops' counts are runtime
    kernel arguments, so the kernels' source (and Triton's binary) is the same at every
    padded size; the unpadded inputs may be shorter than the plan's padded size along
    their dynamic axes (``SHORT``), and the kernels' loads past L read 0.
    """
    mg = mugraph.validate()
    specs = mg.tensors
    custom = [k for k in mg.kernels if isinstance(k, CustomKernel)]
    fn_names = Names(set())
    causal = {k.output: k.node.arg for k in mg.kernels  # masks computed from positions
              if k.kind == "predefined" and k.node.op is Op.CAUSAL}
    for t in length_masks:
        rows, cols, _ = causal[t]
        causal[t] = (rows, cols, "(seq_len - 1)")
    writers = {id(k): KernelWriter.write(k, specs, fn_names(f"{identifier(k.name)}_kernel"),
                                         causal, family)
               for k in custom}
    short = {n: tuple(sorted(family[0][n])) for n in sorted(family[2] if family else ())
             if n in mg.inputs}
    host = Names(_HOST_RESERVED | fn_names.used)
    var = {name: host(name) for name in specs}
    names = list(mg.inputs)
    # the kernels' constexpr strides: an input's from its signature's entry, a torch op's
    # result's asked once, and literals for the contiguous tensors the launcher allocates
    strides = {n: [host(f"{var[n]}_s{d}") for d in range(len(specs[n].shape))] for n in names}
    written = {t: spec for k in custom for t, spec in k.output_specs().items()}
    strides.update({t: [str(s) for s in contiguous_strides(spec.shape)]
                    for t, spec in written.items()})
    pointed = {t for k in custom for t in writers[id(k)].reads}
    first = (var[names[0]], specs[names[0]].dtype) if names else None
    lines = [f"# Generated by eqsat-mirage from MuGraph {mg.name!r}: {len(mg.kernels)} kernel(s),",
             f"# {len(custom)} custom (Triton), {len(mg.kernels) - len(custom)} pre-defined "
             "(torch)."]
    if header.strip():
        lines += ["#"] + [f"# {line}".rstrip() for line in header.strip().splitlines()]
    lines += ["#"] + [f"# {line}" for line in str(mg).splitlines()]
    lines += ["", "import os", "", "import torch"]
    lines += ["import triton", "import triton.language as tl"] if custom else []
    lines += ["", "INPUTS = {"] + _specs({n: specs[n] for n in mg.inputs}) + ["}"]
    lines += ["OUTPUTS = {"] + _specs(mg.outputs) + ["}"]
    lines += [f"NEEDS_TRITON = {bool(custom)}",
              *(["SEQ_LEN = None  # a shape family's size L: set it before each call"]
                if length_masks or short else []),
              *([f"SHORT = {short!r}  # input -> axes it may be shorter along (read masked)"]
                if short else []),
              f"REUSE_OUTPUTS = {bool(reuse_outputs)}  # "
              + ("outputs allocated once per input signature, overwritten by the next call"
                 if reuse_outputs else "every call allocates its outputs")]
    for k in custom:
        lines += ["", "", writers[id(k)].text.rstrip("\n")]
    lines += ["", "", bind_source([var[n] for n in names], reuse_outputs, {
        names.index(n): (len(specs[n].shape), axes) for n, axes in short.items()}
    ).rstrip("\n")]
    buffers = [var[t] for t in written] if reuse_outputs else []
    if reuse_outputs:
        params = ", ".join(["device"] + [var[n] for n in names])
        lines += ["", "", f"def _buffers({params}):",
                  '    """The tensors the kernels write, allocated once per input signature '
                  "(REUSE_OUTPUTS):\n    every call with that signature writes and returns "
                  'these same tensors."""']
        lines += [f"    {var[t]} = {_alloc(spec, first)}" for t, spec in written.items()]
        lines.append(f"    return ({', '.join(buffers)}{',' if len(buffers) == 1 else ''})")
    outs = ", ".join(mg.output_tensors)
    doc = textwrap.wrap(f"Inputs {', '.join(names) or '(none)'}: torch tensors by position, by "
                        f"name, or as one dict. Returns a dict of torch tensors: {outs}.", 92)
    if reuse_outputs:
        doc += textwrap.wrap("REUSE_OUTPUTS: the tensors returned are the same at every call "
                             "with the same input signature, overwritten by the next call "
                             "(clone() them to keep them).", 92)
    lines += ["", "", "def run(*args, **kwargs):", f'    """Run MuGraph {mg.name!r}.', ""]
    lines += [f"    {line}" for line in doc] + ['    """']
    ins = "(" + ", ".join(var[n] for n in names) + ("," if len(names) == 1 else "") + ")"
    ins = ins if names else "_"
    entry = ["device"] + [s if n in pointed and n not in short else "_" for n in names
                          for s in strides[n]] + buffers
    one = f"    {ins}, ({', '.join(entry)}{',' if len(entry) == 1 else ''}) = _bind(args, kwargs)"
    if len(one) <= 100:
        lines.append(one)
    elif len(f"    {ins}, entry = _bind(args, kwargs)") <= 100:
        lines += [f"    {ins}, entry = _bind(args, kwargs)"] + unpack(entry, "entry")
    else:
        lines += ["    tensors, entry = _bind(args, kwargs)"]
        lines += unpack([var[n] for n in names], "tensors") + unpack(entry, "entry")
    if length_masks or short:
        lines += ["    if SEQ_LEN is None:",
                  '        raise ValueError("SEQ_LEN (the shape family\'s size L) is not set: "',
                  '                         "set module.SEQ_LEN = L before run()")']
    for n in short:  # a family's input read masked: its strides change with L
        if n in pointed:
            lines += unpack(strides[n], f"{var[n]}.stride()")
    read = mg.materialized()
    for k in mg.kernels:
        if isinstance(k, PredefinedKernel):
            n = k.node
            if n.op is Op.CAUSAL and k.output not in read:
                lines.append(f"    # kernel {k.name}: causal mask {list(n.shape)}, computed from "
                             "positions inside the kernels that use it")
                continue
            lines += fit([f"{var[k.output]} = {_torch_op(k, var)}  # kernel {k.name}: "
                          f"{n.op.name.lower()} -> {_short(n.dtype)}{list(n.shape)}"], "    ")
            if k.output in pointed and n.shape:  # a torch op's result: any strides
                strides[k.output] = [host(f"{var[k.output]}_s{d}") for d in range(len(n.shape))]
                lines += unpack(strides[k.output], f"{var[k.output]}.stride()")
            continue
        grid = ", ".join(str(g) for g in k.grid)
        lines.append(f"    # kernel {k.name}: custom, grid ({grid}), forloop {k.forloop}"
                     + (" (into reused buffers)" if reuse_outputs else ""))
        if not reuse_outputs:
            lines += [f"    {var[t]} = {_alloc(spec, first)}"
                      for t, spec in k.output_specs().items()]
        lines += ["    " + line for line in writers[id(k)].launch(var, strides)]
    result = [f'"{o}": {var[t]}' for o, t in mg.output_tensors.items()]
    ret = wrap(result, "    ", ",")
    if len(ret) == 1:
        lines.append(f"    return {{{ret[0].strip().rstrip(',')}}}")
    else:
        lines += ["    return {"] + ["    " + r for r in ret] + ["    }"]
    return "\n".join(lines) + "\n"


def private_folder(directory: str | os.PathLike | None = None) -> Path:
    """The folder generated modules are written to and imported from.

    Default: ``eqsat_mirage_triton_<uid>`` in the system's temp directory, created with mode
    0700. Any folder (the default or ``directory``) must belong to this user and be
    writable by no one else, or a ``CodegenError`` names it: a module another user could
    swap in would run inside this process.
    """
    uid = os.getuid() if hasattr(os, "getuid") else None
    if directory is not None:
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
    else:
        owner = uid if uid is not None else "user"
        folder = Path(tempfile.gettempdir()) / f"eqsat_mirage_triton_{owner}"
        folder.mkdir(mode=0o700, exist_ok=True)
    if uid is not None:
        st = folder.stat()
        if st.st_uid != uid or st.st_mode & 0o022:
            raise CodegenError(
                f"refusing to write generated modules to {folder}: it must belong to this user "
                f"(uid {uid}; it belongs to uid {st.st_uid}) and be writable by no one else "
                f"(mode {oct(st.st_mode & 0o777)}); remove it or pass directory= a private folder")
    return folder


def compile_mugraph(mugraph: MuGraph, header: str = "",
                    directory: str | os.PathLike | None = None,
                    reuse_outputs: bool = False,
                    length_masks: frozenset[str] = frozenset(),
                    family: tuple[Mapping[str, set], frozenset[str], frozenset[str]] | None = None
                    ) -> Callable:
    """Generate, write and import the module of ``mugraph``; returns its ``run``.

    ``run(*tensors, **by_name)`` takes torch tensors (positionally in input order, by
    name, or one dict) and returns ``{output name: tensor}``. With ``reuse_outputs``
    those tensors (and the intermediates between kernels) are allocated once per input
    signature and returned again by every later call with it: the next call overwrites
    them, so ``clone()`` what must be kept (off by default). The module is written to
    ``directory`` (default: a private per-user folder in the system's temp directory, see
    ``private_folder``) under a name derived from its content; ``run.source`` and
    ``run.path`` give the text and the file. ``length_masks`` and ``family``: see
    ``triton_source``.
    Triton is imported here: on a CPU, set ``TRITON_INTERPRET=1`` before that.
    """
    source = triton_source(mugraph, header, reuse_outputs, length_masks, family)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    path = private_folder(directory) / f"mugraph_{digest}.py"
    if not path.exists() or path.read_text() != source:
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)
    name = f"eqsat_mirage_triton_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    run = module.run
    if os.environ.get("TRITON_INTERPRET") == "1" and module.NEEDS_TRITON:
        inner = run

        @functools.wraps(inner)
        def run(*args, **kwargs):  # the interpreter computes padding lanes too: 0/0 is fine
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                return inner(*args, **kwargs)

    run.source, run.path, run.module = source, str(path), module
    return run
