"""What a weight-streaming matrix-vector product reaches on this GPU, schedule by schedule.

    python3 bench/gemv_probe.py --out gemv.json            # on the GPU machine (torch, triton)
    TRITON_INTERPRET=1 python bench/gemv_probe.py --device cpu --small --out /tmp/g.json
    python3 bench/gemv_probe.py --int8 --out gemv_int8.json   # int8 codes, a scale per row

At batch 1 a LLaMA layer's time is the time to read its weights (docs/gpu.md, issue 50).
Our fused MLP kernel at sequence 1 streams its 180 MB at 2.0 TB/s (172 blocks of 64 rows,
one 64 x 64 tile a step), cuBLAS at 3.7 TB/s. This probe times one Triton kernel shape,
``y = x @ W.T`` with ``W`` [N, K] stored as ``nn.Linear`` stores it, over the schedule
choices a search would have to offer (rows per block, the chunk of K a step loads, a split
of K over blocks with an atomic float32 sum, warps, pipeline stages), beside cuBLAS, on the
7B layer's projection shapes, and checks each result against cuBLAS in float32. It imports
nothing of ``eqsat_mirage``: it runs where only torch and triton are installed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

SHAPES = {"gate": (11008, 4096), "down": (4096, 11008)}
SMALL = {"gate": (64, 256), "down": (32, 512)}
ROWS = (8, 16, 32, 64)
CHUNKS = (256, 512, 1024)
SPLITS = (1, 4, 8)
WARPS = (4,)
STAGES = (1, 3)
TILE_MOST = 16384  # rows x chunk: a float32 accumulator of 128 registers a thread at 4 warps


@triton.jit
def gemv_kernel(x_ptr, w_ptr, s_ptr, y_ptr, n, k, stride_wn,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,  # noqa: N803 (Triton's style)
                SPLIT_K: tl.constexpr, STAGES: tl.constexpr,  # noqa: N803
                SCALED: tl.constexpr):  # noqa: N803
    """One block: BLOCK_N rows of W over its 1 / SPLIT_K share of K, BLOCK_K at a step;
    ``SCALED``: W holds int8 codes whose rows are scaled by ``s`` after the sum (a
    per-channel scale moved across the product)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < n
    share = tl.cdiv(k, SPLIT_K * BLOCK_K) * BLOCK_K
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in tl.range(pid_k * share, tl.minimum(k, (pid_k + 1) * share), BLOCK_K,
                       num_stages=STAGES):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < k
        x = tl.load(x_ptr + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :],
                    mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1)
    if SCALED:
        y = y * tl.load(s_ptr + offs_n, mask=mask_n, other=0.0)
    if SPLIT_K == 1:
        tl.store(y_ptr + offs_n, y, mask=mask_n)
    else:
        tl.atomic_add(y_ptr + offs_n, y, mask=mask_n)


def launch(x, w, cfg, scale=None):
    """``x @ w.T`` in float32 with schedule ``cfg`` (rows, chunk, split, warps, stages);
    with ``scale``, ``w`` is int8 codes and row i of the result is scaled by ``scale[i]``."""
    rows, chunk, split, warps, stages = cfg
    n, k = w.shape
    y = torch.zeros(n, device=w.device, dtype=torch.float32)
    grid = (triton.cdiv(n, rows), split)
    gemv_kernel[grid](x, w, y if scale is None else scale, y, n, k, w.stride(0), BLOCK_N=rows,
                      BLOCK_K=chunk, SPLIT_K=split, STAGES=stages, SCALED=scale is not None,
                      num_warps=warps)
    return y


def timed(fn, reps: int) -> float:
    """Median microseconds of ``fn`` replayed as a CUDA graph (one launch a replay)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def probe(name: str, n: int, k: int, device: str, reps: int, configs,
          int8: bool = False) -> list[dict]:
    """Every schedule of ``configs`` on one [n, k] weight: checked, then timed (cuda).
    ``int8``: the weight as int8 codes over [-127, 127] with a float32 scale per row (the
    reference then is the weight dequantized to float16 and cuBLAS, as eager runs it)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    scale = None
    if int8:
        w = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8).to(device)
        scale = (torch.rand(n, generator=gen) * 0.02 / 127 + 1e-5).to(device)
    else:
        w = (torch.randn(n, k, generator=gen) * 0.02).to(device=device, dtype=torch.float16)
    x = torch.randn(k, generator=gen).to(device=device, dtype=torch.float16)
    want = (w.float() * scale[:, None] if int8 else w.float()) @ x.float()
    nbytes = n * k * (1 if int8 else 2) + (n * 4 if int8 else 0)
    rows = []
    if device == "cuda":
        if int8:  # what eager does with a weight-only int8 linear: dequantize, then cuBLAS
            us = timed(lambda: torch.nn.functional.linear(
                x[None], (w.to(torch.float16) * scale[:, None]).to(torch.float16)), reps)
        else:
            us = timed(lambda: torch.nn.functional.linear(x[None], w), reps)
        rows.append({"shape": name, "n": n, "k": k, "schedule": "eager" if int8 else "cublas",
                     "us": us, "GBps": nbytes / us / 1e3, "ok": True})
    for cfg in configs:
        row = {"shape": name, "n": n, "k": k, "schedule": dict(zip(
            ("rows", "chunk", "split", "warps", "stages"), cfg))}
        try:
            got = launch(x, w, cfg, scale)
            err = ((got - want).abs().max() / want.abs().max()).item()
            row.update(ok=err < 1e-3, rel_err=err)
            if device == "cuda" and row["ok"]:
                row["us"] = timed(lambda c=cfg: launch(x, w, c, scale), reps)
                row["GBps"] = nbytes / row["us"] / 1e3
        except Exception as exc:  # noqa: BLE001 -- a schedule Triton refuses is a row
            row.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:200]}")
        rows.append(row)
    return rows


def main(argv=None) -> int:
    """Probe every shape; print the five fastest schedules of each beside cuBLAS."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--small", action="store_true", help="tiny shapes (the interpreter)")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--int8", action="store_true",
                    help="int8 weights with a float32 scale per row (weight-only int8)")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="stop starting new shapes after this many seconds")
    args = ap.parse_args(argv)
    began = time.perf_counter()
    shapes = SMALL if args.small else SHAPES
    configs = [c for c in itertools.product(ROWS, CHUNKS, SPLITS, WARPS, STAGES)
               if c[0] * c[1] <= TILE_MOST and (not args.small or (c[1] == 256 and c[3] == 4))]
    out = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
           "weights": "int8" if args.int8 else "float16",
           "torch": torch.__version__, "triton": triton.__version__, "rows": []}
    for name, (n, k) in shapes.items():
        if args.budget_s and time.perf_counter() - began > args.budget_s:
            out.setdefault("skipped", []).append(name)
            continue
        rows = probe(name, n, k, args.device, args.reps, configs, args.int8)
        out["rows"] += rows
        args.out.write_text(json.dumps(out, indent=1))
        timed_rows = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])
        bad = [r for r in rows if not r["ok"]]
        print(f"{name} [{n}, {k}]: {len(rows)} rows, {len(bad)} not ok", flush=True)
        for r in timed_rows[:6]:
            print(f"  {r['us']:7.1f} us {r['GBps']:6.0f} GB/s  {r['schedule']}", flush=True)
    return 1 if any(not r["ok"] and "error" not in r for r in out["rows"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
