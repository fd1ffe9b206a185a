"""Real sizes (issue 32): one LlamaDecoderLayer at LLaMA-7B dimensions through torch.compile.

    python bench/real_sizes.py [--hidden 4096] [--seq 128] [--dtype float16]
                               [--time-limit 30] [--layers 1] [--json]
                               [--quant int8|int4g128|w8hand|w4g128hand] [--target h200]

builds a random-init ``transformers`` ``LlamaDecoderLayer`` (hidden 4096, 32 heads, 8
key/value heads, intermediate 11008 by default: LLaMA-7B's dimensions with GQA; nothing is
downloaded), runs it through ``torch.compile(layer, backend=em.backend(...))`` once, with a
fresh results cache, and prints where the compile time went:

- per partition: conversion + optimization seconds, status, and for a partitioned program
  the partition step, each piece's search (saturation, extraction, fusion planning, compile
  check, verification, from the piece's pass records: the verify pass's seconds less the
  compile check it runs), the stitch and the end-to-end float check;
- the whole compile call's wall-clock seconds against the time limit;
- peak memory: measured (this process's VmHWM; Linux carries ``ru_maxrss`` across exec
  from a forked parent) and the verifier's estimate (the largest total the memory budget
  checked in this process: ``verifier/memory.py`` through ``threads_that_fit``), and the
  largest worker process's peak (``RUSAGE_CHILDREN``) and all processes' together
  (``memory_bench.TreeMemory``: /proc sampled every 0.2 s) where pieces were searched in
  worker processes (``jobs="auto"`` at real sizes);
- coverage (ops optimized / compute ops / all), predicted us one kernel per op -> chosen
  (h100 cost model), and the largest error against eager (relative to max |eager|).

One experiment per process: the machine is shared, run one 7B-size experiment at a time.
``--layers N`` stacks N identical layers (the identical-pieces case). ``--verify-piece I``
only times the verification of piece I's first candidate, twice with one memo (the second
is what each further candidate of a search costs), with the memory estimate and peak.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import eqsat_mirage as em  # noqa: E402
from bench.memory_bench import TreeMemory, peak_bytes  # noqa: E402

SEVEN_B = {"hidden": 4096, "heads": 32, "kv_heads": 8, "intermediate": 11008}


def layer(hidden: int, heads: int, kv_heads: int, intermediate: int, seq: int, dtype: str,
          layers: int = 1, seed: int = 0, quant: str | None = None):
    """(function, example inputs) of ``layers`` random-init LlamaDecoderLayers in a row;
    ``quant``: their linear weights quantized as ``hf_models.quantized`` does ("int8",
    "int4g128" through torchao; "w8hand", "w4g128hand" written by hand)."""
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama import modeling_llama as ml

    torch.manual_seed(seed)
    dt = getattr(torch, dtype)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=intermediate,
                      num_attention_heads=heads, num_key_value_heads=kv_heads,
                      num_hidden_layers=layers, vocab_size=128,
                      max_position_embeddings=max(2 * seq, 16), attn_implementation="sdpa")
    x = torch.randn(1, seq, hidden, dtype=dt)
    pos = torch.arange(seq)[None]
    cos, sin = ml.LlamaRotaryEmbedding(cfg)(x, pos)
    mods = [ml.LlamaDecoderLayer(cfg, i).eval().to(dt) for i in range(layers)]
    # identical layers: the same weights (a stack of one layer's copies); weights are inputs
    # of the graph, so the pieces are equal up to renaming either way
    for m in mods[1:]:
        m.load_state_dict(mods[0].state_dict())
    if quant:
        from bench.hf_models import quantized

        mods = [quantized(m, quant, dt) for m in mods]

    def fn(h):
        for m in mods:
            h = m(h, attention_mask=None, position_embeddings=(cos, sin), position_ids=pos)
            h = h[0] if isinstance(h, (tuple, list)) else h
        return h

    return fn, (x,)


class Estimates:
    """The largest memory estimate the budget checked (``threads_that_fit``), recorded by
    wrapping the verifier's and the end-to-end check's calls to it."""

    def __init__(self) -> None:
        self.most, self.what = 0, ""

    def install(self) -> None:
        from eqsat_mirage.verifier import endtoend, memory, verify

        real = memory.threads_that_fit

        def recorded(parts_for, most, what, budget=None):
            threads = real(parts_for, most, what, budget)
            total = sum(n for _, n in parts_for(threads))
            if total > self.most:
                self.most, self.what = total, f"{what} ({threads} at once)"
            return threads

        verify.threads_that_fit = recorded
        endtoend.threads_that_fit = recorded


def piece_rows(stats: dict) -> list[dict]:
    """One row per piece of a partitioned program's stats."""
    rows = []
    for e in stats.get("pieces", []):
        rows.append({"index": e["index"], "ops": len(e["ops"]), "status": e["status"],
                     "same_as": e["same_as"], "time_limited": e.get("time_limited", False),
                     "seconds": e.get("seconds", 0.0), "phases": e.get("phase_seconds", {}),
                     "compile": e.get("compile_seconds", 0.0), "reason": e["reason"],
                     "before": e.get("cost_before_us"), "after": e.get("cost_after_us")})
    return rows


def profile(report) -> list[dict]:
    """Where each partition's time went (plain data)."""
    out = []
    for e in report:
        res = e.result
        st = res.stats if res is not None else {}
        row = {"name": e.name, "ops": len(e.ops), "status": e.status, "reason": e.reason,
               "seconds": e.seconds, "optimize_seconds": st.get("seconds", 0.0)}
        if "pieces" in st:
            row.update(partition=st.get("partition_seconds", 0.0),
                       search=st.get("search_seconds", 0.0),
                       stitch=st.get("stitch_seconds", 0.0),
                       end_to_end=st.get("end_to_end_seconds", 0.0),
                       end_to_end_message=st.get("end_to_end", ""),
                       pieces=piece_rows(st))
        elif st:
            row.update(phases=st.get("phase_seconds", {}),
                       compile=(st.get("compiled") or {}).get("seconds", 0.0),
                       time_limited=st.get("time_limited", False))
        out.append(row)
    return out


def run(hidden: int, heads: int, kv_heads: int, intermediate: int, seq: int, dtype: str,
        time_limit_s: float | None, layers: int = 1, jobs: int | None = None,
        quant: str | None = None, target: str = "h100") -> dict:
    """Compile the layer(s) once with em.backend, compare with eager; the figures."""
    import torch

    est = Estimates()
    est.install()
    fn, args = layer(hidden, heads, kv_heads, intermediate, seq, dtype, layers, quant=quant)
    torch._dynamo.reset()
    opts = {} if time_limit_s is None else {"time_limit_s": time_limit_s}
    if jobs is not None:
        opts["jobs"] = jobs
    with tempfile.TemporaryDirectory() as tmp:
        be = em.backend(warmup=0, cache=str(Path(tmp) / "cache.sqlite"), target=target,
                        **opts)
        with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            want = fn(*args).float()
            t = time.perf_counter()
            with TreeMemory() as tree:
                got = fn_compiled = torch.compile(fn, backend=be)
                got = fn_compiled(*args).float()
            seconds = time.perf_counter() - t
    s = be.summary()
    err = float((got - want).abs().max() / want.abs().max())
    text = [str(w.message) for w in caught if "eqsat-mirage" in str(w.message)]
    return {"hidden": hidden, "heads": heads, "kv_heads": kv_heads,
            "intermediate": intermediate, "seq": seq, "dtype": dtype, "layers": layers,
            "quant": quant, "target": target,
            "time_limit_s": be.options["time_limit_s"], "compile_seconds": seconds,
            "time_limit_used_s": [g.get("time_limit_s") for g in s["graphs"]],
            "ops": s["ops"], "compute_ops": s["compute_ops"],
            "optimized_ops": s["optimized_compute_ops"], "partitions": s["optimized_partitions"],
            "before_us": (s["predicted_us"] or [None])[0],  # None: no graph was priced
            "after_us": (s["predicted_us"] or [None, None])[1],
            "graph_outcomes": [f"{g['outcome']}: {g['reason']}" for g in s["graphs"]],
            "max_error": err, "finite": bool(torch.isfinite(got).all()),
            "peak_bytes": peak_bytes(), "estimate_bytes": est.most,
            "worker_peak_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
            "tree_peak_bytes": tree.peak,
            "estimate_what": est.what, "warnings": text, "profile": profile(be.report)}


def show(r: dict) -> str:
    """The figures of ``run`` in words, one line per step."""
    gb = 1e9
    lines = [f"LlamaDecoderLayer x{r['layers']}: hidden {r['hidden']}, {r['heads']} heads, "
             f"{r['kv_heads']} KV heads, intermediate {r['intermediate']}, batch 1, seq "
             f"{r['seq']}, {r['dtype']}"
             + (f", weights {r['quant']}" if r.get("quant") else "")
             + f"; {r.get('target', 'h100')} cost model; time_limit_s={r['time_limit_s']}"
             + (f" ({', '.join(f'{x:g} s' for x in r['time_limit_used_s'] if x)})"
                if r["time_limit_s"] == "auto" else ""),
             f"compile call: {r['compile_seconds']:.1f} s; coverage {r['optimized_ops']} / "
             f"{r['compute_ops']} compute ops / {r['ops']} ops in {r['partitions']} optimized "
             f"partition(s); "
             + (f"predicted {r['before_us']:.1f} -> {r['after_us']:.1f} us" if r["before_us"]
                is not None else "no graph priced (" + "; ".join(r["graph_outcomes"]) + ")")
             + f"; max error vs eager {r['max_error']:.2e} (finite: {r['finite']})",
             f"peak memory: measured {r['peak_bytes'] / gb:.2f} GB (VmHWM), estimated "
             f"{r['estimate_bytes'] / gb:.2f} GB ({r['estimate_what']})"
             + (f"; all processes together {r['tree_peak_bytes'] / gb:.2f} GB (sampled every "
                f"0.2 s)" if "tree_peak_bytes" in r else "")
             + (f", the largest worker process {r['worker_peak_bytes'] / gb:.2f} GB (its "
                f"estimates are not recorded here)" if r.get("tree_peak_bytes", 0)
                > r["peak_bytes"] + 2**29 else "")]
    for p in r["profile"]:
        lines.append(f"partition {p['name']} ({p['ops']} ops): {p['status']} in "
                     f"{p['seconds']:.1f} s (optimize {p['optimize_seconds']:.1f} s)"
                     + (f" - {p['reason']}" if p["reason"] else ""))
        if "pieces" in p:
            lines.append(f"  partition step {p['partition']:.2f} s, piece searches "
                         f"{p['search']:.1f} s, stitch and costs "
                         f"{max(0.0, p['stitch'] - p['end_to_end']):.2f} s, end-to-end check "
                         f"{p['end_to_end']:.1f} s ({p['end_to_end_message']})")
            for q in p["pieces"]:
                ph = q["phases"]
                lines.append(
                    f"  piece {q['index']} ({q['ops']} ops): {q['status']}"
                    + (f" (same as {q['same_as']})" if q["same_as"] is not None else "")
                    + (" [time-limited]" if q["time_limited"] else "")
                    + f", {q['seconds']:.1f} s: saturate {ph.get('saturate', 0):.1f}, extract "
                    f"{ph.get('extract', 0):.1f}, plan {ph.get('fusion', 0):.1f}, compile "
                    f"check {q['compile']:.1f}, verify "
                    f"{max(0.0, ph.get('verify', 0) - q['compile']):.1f}"
                    + (f"; {q['before']:.1f} -> {q['after']:.1f} us" if q["before"] else "")
                    + (f" - {q['reason']}" if q["status"] != "optimized" else ""))
        elif "phases" in p:
            ph = p["phases"]
            lines.append(f"  saturate {ph.get('saturate', 0):.1f}, extract "
                         f"{ph.get('extract', 0):.1f}, plan {ph.get('fusion', 0):.1f}, compile "
                         f"check {p['compile']:.1f}, verify "
                         f"{max(0.0, ph.get('verify', 0) - p['compile']):.1f}")
    lines += [f"warning: {w}" for w in r["warnings"]]
    lines.append(f"machine: {platform.machine()}, {os.cpu_count()} CPU(s), "
                 f"{platform.python_version()}")
    return "\n".join(lines)


def pieces(hidden: int, heads: int, kv_heads: int, intermediate: int, seq: int,
           dtype: str, quant: str | None = None) -> list:
    """The Lax pieces (em.Graph each) the backend cuts the layer into, without searching
    (``quant``: its linear weights quantized, as ``layer`` takes it)."""
    import torch

    from eqsat_mirage.partition.pieces import partition
    from eqsat_mirage.pipeline import optimize as entry  # em.optimize calls optimize_whole here

    class CapturedError(em.MirageError):  # a project error: the backend goes eager quietly
        pass

    got: list = []
    real = entry.optimize_whole

    def capture(graph, options, cache, progress, piece_ops=None, jobs=1, timer=None,
                start=None):
        got.extend(p.graph for p in (partition(graph, piece_ops) if piece_ops
                                     else partition(graph)))
        raise CapturedError

    fn, args = layer(hidden, heads, kv_heads, intermediate, seq, dtype, quant=quant)
    torch._dynamo.reset()
    entry.optimize_whole = capture
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.compile(fn, backend=em.backend(warmup=0, cache=None))(*args)
    finally:
        entry.optimize_whole = real
    return got


def verify_piece(index: int, seq: int, dims: dict, dtype: str = "float16",
                 quant: str | None = None) -> dict:
    """Verification of one piece at real size, as a search runs it: the piece's first
    candidate (its search's fusion plan, found by ``em.optimize`` with the verifier
    recording instead of deciding), then verified twice with one memo (the first
    candidate pays for the input program's values, the next ones reuse them); seconds,
    verdicts, the memory estimate and this process's peak."""
    from eqsat_mirage.pipeline import search as opt
    from eqsat_mirage.verifier import memory
    from eqsat_mirage.verifier.verify import VerifyResult, verify

    graph = pieces(dims["hidden"], dims["heads"], dims["kv_heads"], dims["intermediate"],
                   seq, dtype, quant)[index]
    seen: list = []

    def record(a, b, **kwargs):
        seen.append(b)
        return VerifyResult(False, 1.0, reason="recorded", inconclusive=True)

    opt.verify = record
    try:
        em.optimize(graph, time_limit_s=900, cache=None)
    finally:
        opt.verify = verify
    mugraphs = [b for b in seen if b is not graph and hasattr(b, "kernels")]
    cand = mugraphs[0] if mugraphs else seen[0]
    memo: dict = {}
    est = {t: sum(n for _, n in memory.verify_parts(graph, cand, t, 4)) for t in (1, 2)}
    load = os.getloadavg()
    runs = []
    for _ in range(2):
        t = time.perf_counter()
        r = verify(graph, cand, trials=3, seed=0, max_bound=1e-9 / 4, memo=memo,
                   float_first=True)
        runs.append({"seconds": time.perf_counter() - t, "verdict": str(r),
                     "equivalent": r.equivalent})
    return {"piece": index, "ops": len(graph.nodes()), "candidate": cand.name, "seq": seq,
            "estimate_bytes": est, "peak_bytes": peak_bytes(), "runs": runs,
            "load": [load, os.getloadavg()]}


def main(argv=None) -> int:
    """Run one experiment and print its profile (``--json``: the figures as one JSON line)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=SEVEN_B["hidden"])
    ap.add_argument("--heads", type=int, default=SEVEN_B["heads"])
    ap.add_argument("--kv-heads", type=int, default=SEVEN_B["kv_heads"])
    ap.add_argument("--intermediate", type=int, default=SEVEN_B["intermediate"])
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--time-limit", type=float, default=None,
                    help="time_limit_s (default: em.backend's default)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quant", choices=("int8", "int4g128", "fp8", "w8hand", "w4g128hand"),
                    help="quantize the linear weights (hf_models.quantized)")
    ap.add_argument("--target", default="h100", help="the cost model's GPU (default h100)")
    ap.add_argument("--verify-threads", type=int, default=None, metavar="N",
                    help="the verifier's threads (default: verifier.runner.THREADS): "
                         "1 measures what the second core gives")
    ap.add_argument("--verify-piece", type=int, default=None, metavar="INDEX",
                    help="only time the verification of piece INDEX's first candidate")
    args = ap.parse_args(argv)
    if args.verify_threads is not None:
        from eqsat_mirage.verifier import endtoend, runner, verify

        runner.THREADS = verify.THREADS = endtoend.THREADS = max(1, args.verify_threads)
    if args.verify_piece is not None:
        dims = {"hidden": args.hidden, "heads": args.heads, "kv_heads": args.kv_heads,
                "intermediate": args.intermediate}
        print(json.dumps(verify_piece(args.verify_piece, args.seq, dims, args.dtype,
                                      args.quant)))
        return 0
    r = run(args.hidden, args.heads, args.kv_heads, args.intermediate, args.seq, args.dtype,
            args.time_limit, args.layers, args.jobs, args.quant, args.target)
    print(json.dumps(r) if args.json else show(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
