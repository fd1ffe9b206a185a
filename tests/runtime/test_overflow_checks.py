"""``runtime.load.overflow_checks_off``: a loaded module's ``run`` under ``TRITON_INTERPRET=1``
leaves out Triton's integer-overflow sanitizer only where it checks nothing (its
``device_assert`` does nothing without ``debug``), so every value and error is the same;
with ``debug`` the sanitizer stays and still raises; the options are put back after."""

# ruff: noqa: E402 (TRITON_INTERPRET is set before anything can import triton)
from __future__ import annotations

import dataclasses
import os
import textwrap

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (here or by the module)

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from eqsat_mirage.runtime.load import load_source, overflow_checks_off

# a module as the generator writes one: ``run`` launches a kernel whose int32 products
# overflow (x * 65536 * 65536 wraps to 0 in int32) and records the sanitizer's setting
SOURCE = textwrap.dedent('''
    import torch
    import triton
    import triton.language as tl

    NEEDS_TRITON = True
    SEEN = []


    @triton.jit
    def wrap_kernel(x_ptr, o_ptr, N: tl.constexpr):
        offs = tl.program_id(0) * N + tl.arange(0, N)
        x = tl.load(x_ptr + offs)
        tl.store(o_ptr + offs, x * 65536 * 65536 + x * 3 - 1)


    def run(x):
        from triton.runtime.interpreter import interpreter_builder
        SEEN.append(interpreter_builder.options.sanitize_overflow)
        out = torch.empty_like(x)
        wrap_kernel[(2,)](x, out, N=8)
        return {"O": out}
''')


@pytest.fixture()
def builder():
    from triton.runtime.interpreter import interpreter_builder

    saved = interpreter_builder.options
    yield interpreter_builder
    interpreter_builder.options = saved


def wrapped(x):
    """What int32 arithmetic gives: x * 2**32 wraps to 0."""
    return x * 3 - 1


def test_the_sanitizer_is_off_only_inside_and_the_options_come_back(builder, tmp_path):
    before = builder.options
    assert before.sanitize_overflow and not before.debug  # the interpreter's defaults
    run = load_source(SOURCE, directory=tmp_path)
    x = torch.arange(16, dtype=torch.int32)
    assert torch.equal(run(x)["O"], wrapped(x))
    assert run.module.SEEN == [False]  # the run skipped the sanitizer
    assert builder.options is before  # the very options object put back
    with overflow_checks_off():
        assert not builder.options.sanitize_overflow
        assert dataclasses.replace(builder.options, sanitize_overflow=True) == before
    assert builder.options is before


def test_with_debug_the_sanitizer_stays_and_raises(builder, tmp_path):
    debug = dataclasses.replace(builder.options, debug=True)
    builder.options = debug
    run = load_source(SOURCE, directory=tmp_path)
    x = torch.arange(16, dtype=torch.int32)
    with pytest.raises(Exception, match="overflow"):
        run(x)
    assert run.module.SEEN[-1] is True and builder.options is debug
    ok = torch.zeros(16, dtype=torch.int32)  # no overflow: the same values with it
    assert torch.equal(run(ok)["O"], wrapped(ok)) and builder.options is debug


def test_the_same_values_with_and_without_the_sanitizer(builder, tmp_path):
    run = load_source(SOURCE, directory=tmp_path)
    x = torch.randint(-2**20, 2**20, (16,), dtype=torch.int32)
    off = run(x)["O"]
    inner = run.__wrapped__  # the module's own run, the sanitizer on (and no assertion)
    assert builder.options.sanitize_overflow
    assert torch.equal(inner(x)["O"], off) and run.module.SEEN[-1] is True


def test_options_another_run_set_meanwhile_are_left_alone(builder):
    before = builder.options
    with overflow_checks_off():
        inner = builder.options
        with overflow_checks_off():  # finds it off: changes nothing, puts nothing back
            assert builder.options is inner
        assert builder.options is inner
        other = dataclasses.replace(before, debug=True)
        builder.options = other  # set by someone else while this one ran
    assert builder.options is other
