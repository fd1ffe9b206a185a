"""The compile check's child Python (``codegen.buildserver``): kept across builds, the same
resources as a child per build, errors and deadlines as before (issue 51)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from mugraph_examples import attention_tiles

from eqsat_mirage.codegen.buildserver import BuildServer
from eqsat_mirage.codegen.concat import CodegenError
from eqsat_mirage.codegen.source import triton_source
from eqsat_mirage.codegen.tune import can_tune
from eqsat_mirage.ir.errors import TimeLimitError
from eqsat_mirage.ir.limits import Deadline

needs_compiler = pytest.mark.skipif(not can_tune("h100"), reason="no Triton NVIDIA compiler")


def _one_shot(source: str) -> list[dict]:
    """The kernels' resources from a child per build (``compiled``'s one-build mode)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "eqsat_mirage.codegen.compiled", "h100"],
                          input=source, text=True, capture_output=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _figures(kernels: list[dict]) -> list[dict]:
    return [{k: v for k, v in d.items() if k != "seconds"} for d in kernels]


@needs_compiler
def test_one_child_builds_module_after_module_as_a_child_per_build_did():
    server = BuildServer()
    try:
        sources = [triton_source(attention_tiles(32, 64)), triton_source(attention_tiles(64))]
        got = [server.build(s, "h100") for s in sources]
        pid = server.proc.pid
        again = server.build(sources[0], "h100")  # no cache in the child's answer path
        assert server.proc.pid == pid  # the same child built all three
        assert _figures(again) == _figures(got[0])
        for source, kernels in zip(sources, got):
            assert kernels and _figures(kernels) == _figures(_one_shot(source))
    finally:
        server.stop()


@needs_compiler
def test_a_failed_build_is_a_codegen_error_and_the_child_goes_on():
    server = BuildServer()
    try:
        with pytest.raises(CodegenError, match="SyntaxError"):
            server.build("def run(:\n", "h100")
        pid = server.proc.pid
        assert server.build(triton_source(attention_tiles(32, 64)), "h100")
        assert server.proc.pid == pid
    finally:
        server.stop()


@needs_compiler
def test_a_child_that_ended_is_reported_and_replaced():
    server = BuildServer()
    try:
        source = triton_source(attention_tiles(32, 64))
        server.build(source, "h100")
        server.proc.kill()  # ended between builds: the next build starts another
        server.proc.wait()
        assert server.build(source, "h100")
        with pytest.raises(CodegenError, match="compiler process failed"):
            server.build("import os\nos._exit(3)\n", "h100")  # ends during a build
        assert server.proc is None
        assert server.build(source, "h100")  # a new child
    finally:
        server.stop()


def test_past_the_deadline_nothing_is_built():
    server = BuildServer()
    with pytest.raises(TimeLimitError, match="before it started"):
        server.build(triton_source(attention_tiles(32, 64)), "h100", Deadline(0.0))
    assert server.proc is None  # no child was started for it


@needs_compiler
def test_a_build_the_deadline_passes_kills_the_child():
    server = BuildServer()
    try:
        with pytest.raises(TimeLimitError, match="stopped at its time limit"):
            server.build(triton_source(attention_tiles(64)), "h100", Deadline(0.05))
        assert server.proc is None
    finally:
        server.stop()


def _split_matmul():
    """X @ W with its contraction split across the grid: a part kernel and a reduce kernel."""
    import eqsat_mirage as em
    from eqsat_mirage.fusion.lower import lower
    from eqsat_mirage.fusion.schedule import Schedule, index_fragment

    g = em.Graph("split_mm")
    x = g.input("X", (64, 1024), "float16")
    w = g.input("W", (1024, 64), "float16")
    g.output(x @ w, "Y")
    ix = index_fragment(g)
    rows, inner = ix.input_index("X", 0), ix.input_index("X", 1)
    return lower(g, Schedule(grid={rows: 4, inner: 8}, split=inner), indexing=ix)


@needs_compiler
def test_a_module_built_again_with_one_kernel_changed_as_a_child_per_build():
    # the child keeps each kernel's build: the unchanged kernel is not compiled again, and
    # the figures are those of a fresh child per build
    mg = _split_matmul()
    custom = [k for k in mg.kernels if k.kind == "custom"]
    assert len(custom) == 2
    server = BuildServer()
    try:
        first = triton_source(mg)
        custom[1].num_warps = 8
        second = triton_source(mg)
        assert first != second
        got = [server.build(s, "h100") for s in (first, second)]
        assert got[1][1]["num_warps"] == 8 and got[0][1]["num_warps"] != 8
        for source, kernels in zip((first, second), got):
            assert _figures(kernels) == _figures(_one_shot(source))
    finally:
        server.stop()


def test_the_build_caches_keep_at_most_kept_entries_the_oldest_dropped():
    from eqsat_mirage.codegen import compiled

    cache: dict = {}
    for i in range(compiled.KEPT + 10):
        compiled.keep_bounded(cache, i, i * i)
    assert len(cache) == compiled.KEPT
    assert min(cache) == 10 and cache[compiled.KEPT + 9] == (compiled.KEPT + 9) ** 2


@needs_compiler
def test_a_child_started_before_its_first_build_is_the_one_that_builds(monkeypatch):
    """A search with the compile check starts the child as it begins (``start_builds``), so
    that torch's import and Triton's first compile (about 2.5 s of its first build) run
    beside the search; that child then builds, with the figures of a fresh one."""
    from eqsat_mirage.codegen import buildserver, compiled

    server = BuildServer()
    monkeypatch.setattr(buildserver, "SERVER", server)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    try:
        compiled.start_builds()
        assert server.proc is not None and server.proc.poll() is None
        pid = server.proc.pid
        server.start()  # started already: the same child
        assert server.proc.pid == pid
        source = triton_source(attention_tiles(32, 64))
        assert _figures(server.build(source, "h100")) == _figures(_one_shot(source))
        assert server.proc.pid == pid
    finally:
        server.stop()
