"""Every generated kernel compiled for the real target, without a GPU (pipeline step 8).

Triton's compiler runs on a CPU when it is given an explicit target
(``GPUTarget("cuda", 90, 32)`` for sm_90a: h100 and h200; 80 for a100); it
uses the ptxas that ships in the triton wheel. ``compile_report``
takes a generated module's source (``triton_source``), records each kernel
launch of its ``run`` with the launches stubbed and meta tensors as inputs (so
the argument types, the constexpr strides and block sizes and the launch options
are the launcher's own), compiles each kernel for the target and reads the resources
back: registers, spill stores and stack frame (the wheel's ``ptxas -v``) and
shared memory (Triton's metadata).
Results are cached in memory by (source, target), and each kernel's by what Triton caches it by.
"""

from __future__ import annotations

import contextlib
import hashlib
import linecache
import os
import re
import subprocess
import tempfile
import time
import types
from collections.abc import Mapping
from dataclasses import dataclass

from ..ir.errors import TimeLimitError
from ..ir.limits import KEPT, keep_bounded  # noqa: F401 - compiled.KEPT: the caches' bound
from .concat import CodegenError

ARCH = {"h100": 90, "h200": 90, "a100": 80}  # compute capability of each built-in target
_CACHE: dict[tuple[str, str], list] = {}
# one kernel's build by what Triton's own cache keys it on (the jit function's cache_key:
# its source, line and dependencies; the signature, constexprs and launch options) and the
# target: registers, spill and stack bytes, shared bytes, warps and stages. A module built
# again after one kernel changed (a re-plan, a warp retry) compiles and ptxas-checks only
# that kernel: the tiny LLaMA layer's compile check built its unchanged kernels 18 times
_KERNELS: dict[tuple, tuple[int, int, int, int, int, int]] = {}
# each of the two caches keeps at most KEPT entries (ir.limits.keep_bounded: the oldest
# go first): bounded memory


_DTYPES = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32",
           "torch.bool": "i1", "torch.int8": "i8", "torch.uint8": "u8", "torch.int32": "i32",
           "torch.int64": "i64", "torch.float8_e4m3fn": "fp8e4nv", "torch.float8_e5m2": "fp8e5"}


@dataclass(frozen=True)
class KernelResources:
    """One kernel as the target's compiler built it."""

    kernel: str
    grid: tuple
    registers: int
    spill_bytes: int  # spill stores per thread, as ptxas -v reports them (0: no spills)
    stack_bytes: int
    shared_bytes: int
    num_warps: int
    num_stages: int
    seconds: float

    def __str__(self) -> str:
        return (f"{self.kernel}: grid {self.grid}, {self.registers} registers, "
                f"{self.spill_bytes} B spilled, {self.shared_bytes / 1024:.1f} KiB shared, "
                f"{self.num_warps} warps, {self.num_stages} stages")


@contextlib.contextmanager
def _interpreter(on: bool):
    """``TRITON_INTERPRET`` set (on) or unset (off) for the duration, then restored."""
    saved = os.environ.pop("TRITON_INTERPRET", None)
    if on:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        os.environ.pop("TRITON_INTERPRET", None)
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved


def _load(source: str):
    """The generated module, executed from memory with real (not interpreted) kernels."""
    name = "eqsat_mirage_compiled_" + hashlib.sha256(source.encode()).hexdigest()[:16]
    filename = f"<{name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = types.ModuleType(name)
    module.__file__ = filename
    with _interpreter(False):
        exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102 - ours, in memory
    return module


def _length(module) -> int:
    """A length a shape family's module serves (its size's axes are named in INPUTS): 17
    where it can (not 1 and not a multiple of 16, which Triton would specialize)."""
    if not hasattr(module, "SIZE"):
        return 17
    low, high = module.LENGTHS
    if module.PADDED:  # a module of one padded size: a length inside it
        return max(module.PADDED - module.GRANULE + 1, low)
    return max(17, low) if high is None else min(max(17, low), high)


def record_launches(module, inputs: Mapping | None = None
                    ) -> list[tuple[str, object, tuple, tuple, dict]]:
    """(kernel name, function, grid, args, keyword args) of each launch ``module.run``
    makes on ``inputs`` (default: meta tensors of its ``INPUTS``; a shape family's axes at
    ``_length``). The kernels are recorded, not run, and put back afterwards."""
    import torch

    seen = []

    class Recorder:
        def __init__(self, name, fn):
            self.name, self.fn = name, fn

        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.append((self.name, self.fn, grid, args, kwargs))

    kernels = {attr: obj for attr, obj in vars(module).items()
               if attr.endswith("_kernel") and hasattr(obj, "arg_names")}
    if inputs is None:
        length = _length(module)
        inputs = {n: torch.empty(tuple(length if isinstance(d, str) else d for d in shape),
                                 dtype=dtype, device="meta")
                  for n, (shape, dtype) in module.INPUTS.items()}
    try:
        for attr, fn in kernels.items():
            setattr(module, attr, Recorder(attr, fn))
        with _interpreter(True):  # lets the launcher accept meta (or CPU) tensors
            module.run(**inputs)
    finally:
        for attr, fn in kernels.items():
            setattr(module, attr, fn)
    return seen


def _signature(fn, args: tuple, kwargs: dict) -> tuple[dict, dict, dict]:
    """Triton's signature, constexprs and launch options for one recorded launch."""
    import torch

    sig, consts, options = {}, {}, {}
    names = list(fn.arg_names)
    constexpr = {p.name for p in getattr(fn, "params", ()) if p.is_constexpr}
    for name, a in zip(names, args):
        if name in constexpr:  # e.g. the strides, passed by position
            sig[name], consts[name] = "constexpr", a
        elif isinstance(a, torch.Tensor):
            sig[name] = "*" + _DTYPES[str(a.dtype)]
        elif isinstance(a, bool):
            sig[name] = "i1"
        elif isinstance(a, int):
            sig[name] = "i32" if -2**31 <= a < 2**31 else "i64"
        else:
            sig[name] = "fp32"
    for key, v in kwargs.items():
        if key in ("num_warps", "num_stages"):
            options[key] = v
        else:
            sig[key], consts[key] = "constexpr", v
    return sig, consts, options


def _resources(ptx: str, arch: int, name: str) -> dict[str, int]:
    """Registers, stack frame and spill stores of kernel ``name`` by the wheel's ptxas -v."""
    import triton.backends.nvidia as nv

    tool = os.path.join(os.path.dirname(nv.__file__), "bin", "ptxas")
    suffix = "a" if arch == 90 else ""
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        out = subprocess.run([tool, f"-arch=sm_{arch}{suffix}", "-v", src, "-o",
                              os.path.join(d, "k.cubin")], capture_output=True, text=True,
                             timeout=120)
    if out.returncode != 0:
        raise CodegenError(f"ptxas failed on kernel {name!r}: {out.stderr.strip()[:300]}")
    text = out.stdout + out.stderr
    found = {"registers": r"Used (\d+) registers", "stack": r"(\d+) bytes stack frame",
             "spills": r"(\d+) bytes spill stores"}
    return {k: int(m.group(1)) if (m := re.search(rx, text)) else 0 for k, rx in found.items()}


def compile_report(source: str, target: str = "h100", deadline=None) -> list[KernelResources]:
    """Compile each kernel launched by the generated module ``source`` for ``target``.

    Raises ``CodegenError`` naming the kernel when the compiler fails (Triton's compiler
    and the ptxas/cuobjdump in its wheel are needed; no GPU is). Past ``deadline`` (an
    ``ir.limits.Deadline``) it stops with a ``TimeLimitError`` and keeps nothing: in this
    process between kernels (one kernel's compile cannot be interrupted), in the child
    process of ``TRITON_INTERPRET=1`` at the deadline itself (the child is killed).
    """
    if target not in ARCH:
        raise CodegenError(f"compile_report: no compute capability known for target "
                           f"{target!r} (known: {', '.join(ARCH)})")
    key = (hashlib.sha256(source.encode()).hexdigest(), target)
    if key not in _CACHE:
        # a process that runs kernels under TRITON_INTERPRET=1 has triton.language in its
        # interpreted form, which the compiler cannot use: compile in a clean child process
        built = (_in_child(source, target, deadline) if interpreted()
                 else _compile(source, target, deadline))
        keep_bounded(_CACHE, key, built)
    return _CACHE[key]


def _in_child(source: str, target: str, deadline=None) -> list[KernelResources]:
    """``_compile`` in a child Python without TRITON_INTERPRET, one kept for this process's
    lifetime (``buildserver.SERVER``: no imports per build), killed at ``deadline``
    (``TimeLimitError``)."""
    from .buildserver import SERVER

    return [KernelResources(**{**d, "grid": tuple(d["grid"])})
            for d in SERVER.build(source, target, deadline)]


def start_builds() -> None:
    """Start the child Python that ``compile_report`` builds in under TRITON_INTERPRET=1
    (``buildserver.SERVER``) now, so that its imports overlap the caller's work; nothing
    without the interpreter (this process builds)."""
    if interpreted():
        from .buildserver import SERVER

        SERVER.start()


def interpreted() -> bool:
    """Whether this process runs Triton's interpreter (``TRITON_INTERPRET=1``): builds for
    the target then run in the child Python of ``buildserver``."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _compile(source: str, target: str, deadline=None) -> list[KernelResources]:
    """Compile in this process (which must not run the interpreter), kernel by kernel, the
    ``deadline`` checked before each (``TimeLimitError``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    out = []
    for name, fn, grid, args, kwargs in record_launches(_load(source)):
        sig, consts, options = _signature(fn, args, kwargs)
        options = {"num_warps": 4, "num_stages": 3, **options}  # Triton's defaults if absent
        if deadline is not None and deadline.expired():
            raise TimeLimitError(f"the compile for {target} was stopped at its time limit "
                                 f"({deadline.seconds:g} s) before kernel {name!r}")
        t = time.perf_counter()
        key = (fn.cache_key, repr(sorted(sig.items())), repr(sorted(consts.items())),
               repr(sorted(options.items())), target)
        if key not in _KERNELS:
            try:
                with _interpreter(False):
                    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts),
                                       target=GPUTarget("cuda", ARCH[target], 32),
                                       options=options)
            except Exception as exc:  # noqa: BLE001 - the compiler's own error types vary
                raise CodegenError(f"kernel {name!r} does not compile for {target} "
                                   f"(sm_{ARCH[target]}): {type(exc).__name__}: "
                                   f"...{str(exc)[-600:]}") from None
            res = _resources(k.asm["ptx"], ARCH[target], k.metadata.name)
            keep_bounded(_KERNELS, key, (res["registers"], res["spills"], res["stack"],
                                         k.metadata.shared, k.metadata.num_warps,
                                         k.metadata.num_stages))
        out.append(KernelResources(name, tuple(grid), *_KERNELS[key],
                                   time.perf_counter() - t))
    return out


def _answer(source: str, target: str) -> dict:
    """One build's answer in the child: its kernels' resources, or the error's last
    traceback line (``CodegenError: ...`` for the compiler's refusals)."""
    import dataclasses
    import traceback

    try:
        return {"kernels": [dataclasses.asdict(r) for r in _compile(source, target)]}
    except CodegenError as exc:
        return {"error": f"CodegenError: {exc}"}
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which refuses the plan
        return {"error": traceback.format_exception_only(exc)[-1].strip()}


def _warm() -> None:
    """The build child's fixed costs before its first request: torch (which a generated
    module imports: about 2 s) and Triton's compiler, loaded by one tiny kernel built for
    sm_90 (0.65 s). A failure here is left to the real builds to report (``_answer``)."""
    try:
        import torch  # noqa: F401
        import triton
        import triton.language as tl
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        @triton.jit
        def copy(x_ptr, n, BLOCK: tl.constexpr):  # noqa: N803 - Triton style
            offs = tl.arange(0, BLOCK)
            tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

        triton.compile(ASTSource(fn=copy, signature={"x_ptr": "*fp32", "n": "i32",
                                                     "BLOCK": "constexpr"},
                                 constexprs={"BLOCK": 16}),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    except Exception:  # noqa: BLE001 - a warm-up only
        pass


def _main() -> None:
    """The child process: ``--serve`` (``buildserver.BuildServer``'s: a JSON request a line
    on stdin, an answer a line on stdout, whatever else writes to stdout sent to stderr,
    until stdin closes), or one build (source on stdin, the target as argument, resources
    as JSON on stdout)."""
    import json
    import sys

    if sys.argv[1] != "--serve":
        got = _answer(sys.stdin.read(), sys.argv[1])
        if "error" in got:
            sys.exit(got["error"])
        print(json.dumps(got["kernels"]))
        return
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _warm()
    for line in sys.stdin:
        if line.strip():
            ask = json.loads(line)
            out.write(json.dumps(_answer(ask["source"], ask["target"])) + "\n")
            out.flush()


if __name__ == "__main__":
    _main()
