"""``runtime.load.device_patches_once``: under ``TRITON_INTERPRET=1`` a loaded module's ``run``
lets Triton's interpreter patch the language modules for a device function's call (``tl.zeros``)
once per kernel launch, not at every call; the values are the same as with the patch at
every call, each launch still patches, and the interpreter's function is put back after."""

# ruff: noqa: E402 (TRITON_INTERPRET is set before anything can import triton)
from __future__ import annotations

import os
import textwrap

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (here or by the module)

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from eqsat_mirage.runtime.load import device_patches_once, load_source

# a module as the generator writes one: two launches of a kernel that calls the device
# function tl.zeros in a loop (as generated accumulators are made) and sums a reduction
SOURCE = textwrap.dedent('''
    import torch
    import triton
    import triton.language as tl

    NEEDS_TRITON = True


    @triton.jit
    def acc_kernel(x_ptr, o_ptr, N: tl.constexpr, F: tl.constexpr):
        pid = tl.program_id(0)
        acc = tl.zeros((N,), dtype=tl.float32)
        for i in range(F):
            offs = (pid * F + i) * N + tl.arange(0, N)
            part = tl.zeros((N,), dtype=tl.float32) + tl.load(x_ptr + offs)
            acc = acc + part * part
        tl.store(o_ptr + pid * N + tl.arange(0, N), acc + tl.sum(acc, axis=0))


    def run(x):
        out = torch.empty((4, 8), dtype=torch.float32)
        acc_kernel[(4,)](x, out, N=8, F=3)
        again = torch.empty((4, 8), dtype=torch.float32)
        acc_kernel[(4,)](x * 2, again, N=8, F=3)
        return {"O": out, "P": again}
''')


def counting():
    """Count the interpreter's ``_patch_lang`` calls (a fresh count each ``with``)."""
    from triton.runtime import interpreter

    calls = []
    original = interpreter._patch_lang

    def patch(fn):
        calls.append(fn.__name__)
        return original(fn)

    return interpreter, original, patch, calls


def test_the_same_values_fewer_patches_and_the_function_put_back(tmp_path):
    interpreter, original, patch, calls = counting()
    run = load_source(SOURCE, directory=tmp_path)
    x = torch.randn(96, dtype=torch.float32)
    interpreter._patch_lang = patch  # every patch counted, with the shortcut on top
    try:
        once = run(x)
        with_once = list(calls)
        calls.clear()
        every = run.__wrapped__(x)  # the module's own run: a patch at every device call
        without = list(calls)
    finally:
        interpreter._patch_lang = original
    for name in ("O", "P"):
        assert torch.equal(once[name], every[name])
    assert with_once.count("acc_kernel") == without.count("acc_kernel") == 2  # each launch
    assert without.count("zeros") == 2 * 4 * 4  # 2 launches x 4 blocks x (1 + 3) calls
    assert with_once.count("zeros") == 2  # once per launch
    assert interpreter._patch_lang is original


def test_a_nested_or_concurrent_use_leaves_the_function_to_the_first():
    from triton.runtime import interpreter

    original = interpreter._patch_lang
    with device_patches_once():
        inner = interpreter._patch_lang
        assert inner is not original
        with device_patches_once():  # finds it on: changes nothing, puts nothing back
            assert interpreter._patch_lang is inner
        assert interpreter._patch_lang is inner
    assert interpreter._patch_lang is original
