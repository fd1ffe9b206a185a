"""Lowering a MuGraph to Triton: one Python module, and that module compiled to a callable.

``triton_source(mg, header)`` returns the source of one Python module:

- a header comment: the MuGraph's listing, and ``header`` (e.g. the predicted cost);
- ``INPUTS`` / ``OUTPUTS``: name -> (shape, torch dtype);
- one ``@triton.jit`` kernel per custom kernel (``kernel.py``);
- ``run(*tensors, **by_name)``: checks the inputs (a ``ValueError`` naming the input,
  expected and actual shape, dtype or device), allocates every kernel output, runs the
  kernels in order (pre-defined kernels as torch ops, custom kernels as Triton launches
  over their grid) and returns ``{output name: tensor}``.

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
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..ir.node import BINARY, Node, Op
from ..ir.printing import _short
from ..mugraph.kernels import CustomKernel, PredefinedKernel, TensorSpec
from ..mugraph.program import MuGraph
from .concat import CodegenError
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
                            "INPUTS", "OUTPUTS", "NEEDS_TRITON", "_bind"})

_BIND = '''
_CHECKED = {}  # (shape, dtype, device) per input, in order -> device: signatures that passed


def _bind(args, kwargs):
    """The input tensors in INPUTS order, checked (once per signature), and their device."""
    if not kwargs and len(args) == len(INPUTS) and all(isinstance(x, torch.Tensor)
                                                       for x in args):
        device = _CHECKED.get(tuple((x.shape, x.dtype, x.device) for x in args))
        if device is not None and (device.type == "cuda" or not NEEDS_TRITON
                                   or os.environ.get("TRITON_INTERPRET") == "1"):
            return args, device
    tensors, device = _check(args, kwargs)
    if len(_CHECKED) < 64:
        _CHECKED[tuple((x.shape, x.dtype, x.device) for x in tensors)] = device
    return tensors, device


def _check(args, kwargs):
    """The input tensors in INPUTS order, checked, and their device."""
    names = list(INPUTS)
    if len(args) == 1 and isinstance(args[0], dict) and not kwargs:
        args, kwargs = (), dict(args[0])
    if len(args) > len(names):
        raise ValueError(f"run() takes {len(names)} inputs ({', '.join(names)}); "
                         f"got {len(args)} positional arguments")
    given = dict(zip(names, args))
    for name in kwargs:
        if name not in INPUTS:
            raise ValueError(f"unknown input {name!r} (inputs: {', '.join(names)})")
        if name in given:
            raise ValueError(f"input {name!r} given both by position and by name")
    given.update(kwargs)
    missing = [name for name in names if name not in given]
    if missing:
        raise ValueError(f"missing input(s) {', '.join(map(repr, missing))} "
                         f"(inputs: {', '.join(names)})")
    tensors, device = [], None
    for name, (shape, dtype) in INPUTS.items():
        x = given[name]
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"input {name!r}: expected a torch.Tensor of shape {shape} and "
                             f"dtype {dtype}, got {type(x).__name__}")
        if tuple(x.shape) != shape:
            raise ValueError(f"input {name!r}: expected shape {shape}, got {tuple(x.shape)}")
        if x.dtype != dtype:
            raise ValueError(f"input {name!r}: expected dtype {dtype}, got {x.dtype}")
        if device is None:
            device = x.device
        elif x.device != device:
            raise ValueError(f"input {name!r}: expected device {device} (the device of "
                             f"{names[0]!r}), got {x.device}")
        tensors.append(x)
    if device is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if NEEDS_TRITON and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"inputs are on device {device}: the Triton kernels need a CUDA "
                         "device, or TRITON_INTERPRET=1 set before triton is imported")
    return tensors, device
'''


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


def triton_source(mugraph: MuGraph, header: str = "") -> str:
    """The Python module (source text) running ``mugraph`` with Triton kernels and torch.

    ``header`` (e.g. the predicted cost) is added to the module's header comment.
    Raises ``CodegenError`` for a block graph the backend cannot lower.
    """
    mg = mugraph.validate()
    specs = mg.tensors
    custom = [k for k in mg.kernels if isinstance(k, CustomKernel)]
    fn_names = Names(set())
    causal = {k.output: k.node.arg for k in mg.kernels  # masks computed from positions
              if k.kind == "predefined" and k.node.op is Op.CAUSAL}
    writers = {id(k): KernelWriter.write(k, specs, fn_names(f"{identifier(k.name)}_kernel"),
                                         causal)
               for k in custom}
    host = Names(_HOST_RESERVED | fn_names.used)
    var = {name: host(name) for name in specs}
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
    lines += [f"NEEDS_TRITON = {bool(custom)}"]
    for k in custom:
        lines += ["", "", writers[id(k)].text.rstrip("\n")]
    lines += ["", _BIND.rstrip("\n"), "", ""]
    names = list(mg.inputs)
    outs = ", ".join(mg.output_tensors)
    doc = textwrap.wrap(f"Inputs {', '.join(names) or '(none)'}: torch tensors by position, by "
                        f"name, or as one dict. Returns a dict of torch tensors: {outs}.", 92)
    lines += ["def run(*args, **kwargs):", f'    """Run MuGraph {mg.name!r}.', ""]
    lines += [f"    {line}" for line in doc] + ['    """']
    unpack = "(" + ", ".join(var[n] for n in names) + ("," if len(names) == 1 else "") + ")"
    lines.append(f"    {unpack if names else '_'}, device = _bind(args, kwargs)")
    read = set(mg.output_tensors.values()) | {s.arg for k in mg.kernels if k.kind == "predefined"
                                              for s in k.node.srcs if s.op is Op.INPUT}
    for k in mg.kernels:
        if isinstance(k, PredefinedKernel):
            n = k.node
            if n.op is Op.CAUSAL and k.output not in read:
                lines.append(f"    # kernel {k.name}: causal mask {list(n.shape)}, computed from "
                             "positions inside the kernels that use it")
                continue
            lines += fit([f"{var[k.output]} = {_torch_op(k, var)}  # kernel {k.name}: "
                          f"{n.op.name.lower()} -> {_short(n.dtype)}{list(n.shape)}"], "    ")
            continue
        grid = ", ".join(str(g) for g in k.grid)
        lines.append(f"    # kernel {k.name}: custom, grid ({grid}), forloop {k.forloop}")
        for t, spec in k.output_specs().items():
            lines.append(f"    {var[t]} = torch.empty({_shape(spec.shape)}, "
                         f"dtype={TORCH_DTYPE[spec.dtype]}, device=device)")
        lines += ["    " + line for line in writers[id(k)].launch(var)]
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
                    directory: str | os.PathLike | None = None) -> Callable:
    """Generate, write and import the module of ``mugraph``; returns its ``run``.

    ``run(*tensors, **by_name)`` takes torch tensors (positionally in input order, by
    name, or one dict) and returns ``{output name: tensor}``. The module is written to
    ``directory`` (default: a private per-user folder in the system's temp directory, see
    ``private_folder``) under a name derived from its content; ``run.source`` and
    ``run.path`` give the text and the file.
    Triton is imported here: on a CPU, set ``TRITON_INTERPRET=1`` before that.
    """
    source = triton_source(mugraph, header)
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
