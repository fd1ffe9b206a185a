"""Loading a generated module: its source written to a private folder and imported.

``load_source(source)`` writes the text of a generated module (``codegen.source``'s
``triton_source`` or ``family_source``) to a file named after its content (``@triton.jit``
reads its function's source from that file), imports it and returns its ``run``:
``run(*tensors, **by_name) -> {output name: tensor}``, with ``run.source``, ``run.path``
and ``run.module``. The folder is ``private_folder``'s: it must belong to this user and
be writable by no one else. Under ``TRITON_INTERPRET=1`` the interpreter computes the
padding lanes too (a 0/0 there is no error: NumPy's warnings are silenced around
``run``), and a module with a bfloat16 ``tl.dot`` warns once that the interpreter runs
its operands as float32 (``say_bf16_upcast``). There ``run`` also leaves out the
interpreter's integer-overflow sanitizer while its assertions are off
(``overflow_checks_off``): it computes every int32 ``+``, ``-`` and ``*`` again in int64
and compares, only to hand the result to a ``device_assert`` that does nothing without
``debug`` (half the interpreter's time for a tiny LLaMA layer's kernels).

A generated module imports only torch, triton and the standard library, and so does
this module (with NumPy): a deployment runs saved modules without the search's
dependencies.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..ir.errors import MirageError

__all__ = ["CodegenError", "device_patches_once", "load_source", "overflow_checks_off",
           "private_folder", "say_bf16_upcast"]


class CodegenError(MirageError):
    """A MuGraph the Triton code generator cannot lower (names kernel and op), or a
    generated module that cannot be written or imported (names the folder or the line).

    ``kernel``: the custom kernel the writer refused (set by ``KernelWriter.write``; None
    for a refusal of the whole module), so the compile check refuses that kernel's
    structure alone, not every kernel of the plan."""

    kernel = None


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


def load_source(source: str, directory: str | os.PathLike | None = None) -> Callable:
    """Write generated module ``source`` (``triton_source``'s or ``family_source``'s, made
    in this process or saved from one) to ``directory`` (default: ``private_folder()``)
    and import it; returns its ``run`` (module docstring).
    Triton is imported here: on a CPU, set ``TRITON_INTERPRET=1`` before that."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    path = private_folder(directory) / f"mugraph_{digest}.py"
    if not path.exists() or path.read_text() != source:
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)
    name = f"eqsat_mirage_triton_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:  # a generator bug: say where, as the project's error
        sys.modules.pop(name, None)
        raise CodegenError(f"the generated module {path} is not valid Python (line "
                           f"{exc.lineno}: {exc.msg}); please report it") from None
    except BaseException:
        sys.modules.pop(name, None)
        raise
    run = module.run
    if os.environ.get("TRITON_INTERPRET") == "1" and module.NEEDS_TRITON:
        say_bf16_upcast(module)
        inner = run

        @functools.wraps(inner)
        def run(*args, **kwargs):  # the interpreter computes padding lanes too: 0/0 is fine
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"), \
                    overflow_checks_off(), device_patches_once():
                return inner(*args, **kwargs)

    run.source, run.path, run.module = source, str(path), module
    return run


@contextlib.contextmanager
def overflow_checks_off():
    """Triton's interpreter without its integer-overflow sanitizer for the duration, where
    the sanitizer checks nothing: its options have ``sanitize_overflow`` and not ``debug``.
    The sanitizer (``semantic.binary_op_sanitize_overflow_impl``) recomputes each int32
    ``+``, ``-``, ``*`` in int64 and compares it with the int32 range, then hands that to
    ``device_assert``, which returns without asserting unless ``debug`` is set (as a GPU
    build drops it), so every value and every raised error is the same without it. With
    ``debug`` (or a Triton without these options) nothing changes. Only the options this
    call set are put back: a run in another thread meanwhile finds the sanitizer off and
    leaves it to this one."""
    try:
        from triton.runtime.interpreter import interpreter_builder as builder
        before = builder.options
        fields = {f.name for f in dataclasses.fields(before)}
    except (ImportError, AttributeError, TypeError):
        yield
        return
    if not {"sanitize_overflow", "debug"} <= fields or before.debug or \
            not before.sanitize_overflow:
        yield
        return
    off = dataclasses.replace(before, sanitize_overflow=False)
    builder.options = off
    try:
        yield
    finally:
        if builder.options is off:
            builder.options = before


_DEVICE = threading.local()  # per thread: the globals a device call patched in this launch


@contextlib.contextmanager
def device_patches_once():
    """Triton's interpreter patching ``triton.language`` for a device function's call once
    per kernel launch for the duration, not at every call. The interpreter patches the
    language modules a jit function's globals hold (``interpreter._patch_lang``: every
    builtin wrapped to run on NumPy, and the tensor class, ranges and reductions) at each
    launch, restoring them after it, and again at each call of a device function
    (``tl.zeros`` is one: a generated kernel calls it hundreds of times a launch), whose
    patches are never restored. Within one launch a second such patch finds every builtin
    already wrapped and sets the rest to closures that do the same, so it changes nothing:
    it is skipped for a device function whose module's globals a device call already
    patched in this launch (a launch, or any call not made by the interpreter's device
    call, patches as before and starts a new launch's record). Every value is the same; the
    patching took a tenth of a tiny LLaMA layer's interpreted first launch (issue 51).
    Without these names in the installed Triton, nothing changes. Only the function this
    call set is put back: a run in another thread meanwhile patches as before."""
    try:
        from triton.runtime import interpreter as interp
        original = interp._patch_lang
        device = interp.InterpretedFunction.__call__.__code__
    except (ImportError, AttributeError):
        yield
        return
    if getattr(original, "_once", False):  # already on (another run): nothing to do
        yield
        return

    def patch_lang(fn):
        done = getattr(_DEVICE, "done", None)
        if done is None:
            done = _DEVICE.done = set()
        if sys._getframe(1).f_code is not device:  # a launch (or anything else): as before
            done.clear()
            return original(fn)
        key = id(fn.__globals__)
        if key in done:  # patched by a device call of this launch: still in place
            return None  # (a device call drops what it returns)
        result = original(fn)
        done.add(key)
        return result

    patch_lang._once = True
    interp._patch_lang = patch_lang
    try:
        yield
    finally:
        if interp._patch_lang is patch_lang:
            interp._patch_lang = original
        if getattr(_DEVICE, "done", None) is not None:
            _DEVICE.done.clear()


_SAID: set[str] = set()


def say_bf16_upcast(module) -> None:
    """Warn once per process that bfloat16 tl.dot operands run as float32 in the interpreter
    (when generated ``module`` has a bfloat16 dot: its ``BF16_DOT``)."""
    if hasattr(module, "BF16_DOT") and "bf16" not in _SAID:
        _SAID.add("bf16")
        warnings.warn("eqsat-mirage: under TRITON_INTERPRET=1 the generated kernels' bfloat16 "
                      "tl.dot operands are upcast to float32 (Triton 3.8's interpreter computes "
                      "a bfloat16 tl.dot wrong); on a GPU they stay bfloat16", stacklevel=4)
