"""Whole programs (issue 13): chained attention and stacked LLaMA-style decoder blocks.

    python bench/whole_programs.py [--blocks 1 2 4] [--write bench/RESULTS.md]

Each program is optimized through ``em.optimize`` (partitioned into Lax pieces,
pieces searched once, stitched, verified) with a fresh results cache, so search
times are real searches. The decoder blocks are written in plain torch (RMSNorm,
q/k/v/o projections, max-subtracted softmax attention, residuals, SwiGLU MLP) and
converted with ``em.from_torch``; the stitched program's output is compared with
eager torch in float32. Prints (and with ``--write`` puts into the "Whole
programs" section of RESULTS.md) one row per program.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import eqsat_mirage as em  # noqa: E402

SECTION = "## Whole programs"


def chained_attention(b: int = 1, dtype: str = "float16", rows: int = 256,
                      keys: tuple[int, ...] = (4096, 4096), d: int = 64) -> em.Graph:
    """Attention layers in a row (GQA's shapes by default), each one's queries the
    previous one's output; ``keys`` gives each layer's key length."""
    g = em.Graph("attention_x2")
    h = g.input("Q", (2 * b, rows, d), dtype)
    for i, n in enumerate(keys, 1):
        k = g.input(f"K{i}", (2 * b, d, n), dtype)
        v = g.input(f"V{i}", (2 * b, n, d), dtype)
        a = em.exp(h @ k)
        h = (a / a.sum(axis=2, keepdims=True)) @ v
    g.output(h, "O")
    return g


def decoder_stack(blocks: int, d: int = 512, heads: int = 8, f: int = 1536, seq: int = 128):
    """(torch module, example input): ``blocks`` LLaMA-style decoder blocks in plain torch."""
    import torch
    from torch import nn
    from torch.nn import functional as F  # noqa: N812

    class RMSNorm(nn.Module):
        def __init__(self, d: int, eps: float = 1e-6) -> None:
            super().__init__()
            self.weight, self.eps = nn.Parameter(1 + 0.1 * torch.randn(d)), eps

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.h, self.hd = heads, d // heads
            self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
            self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
            self.gate, self.up = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
            self.down = nn.Linear(f, d, bias=False)

        def heads_of(self, t, b, s):
            return t.view(b, s, self.h, self.hd).transpose(1, 2)

        def forward(self, x):
            b, s, _ = x.shape
            h = self.n1(x)
            q, k, v = (self.heads_of(p(h), b, s) for p in (self.q, self.k, self.v))
            a = torch.softmax(q @ k.transpose(-1, -2) * self.hd ** -0.5, dim=-1)
            x = x + self.o((a @ v).transpose(1, 2).reshape(b, s, d))
            h = self.n2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(blocks))

        def forward(self, x):
            for blk in self.blocks:
                x = blk(x)
            return x

    torch.manual_seed(0)
    return Stack().eval(), torch.randn(1, seq, d)


def run_one(name: str, graph, time_limit_s: float, check=None, model=None) -> dict:
    """Optimize ``graph`` with a fresh cache; its row (``check(res)``: max error vs eager;
    with ``model``, the same module through torch.compile, on the same cache)."""
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        res = em.optimize(graph, time_limit_s=time_limit_s, cache=Path(tmp) / "cache.sqlite")
        seconds = time.perf_counter() - t
        compiled = through_compile(*model, time_limit_s, Path(tmp) / "cache.sqlite") \
            if model else None
    pieces = res.stats.get("pieces", [])
    return {"name": name, "ops": sum(len(p["ops"]) for p in pieces),
            "pieces": len(pieces), "distinct": sum(p["same_as"] is None for p in pieces),
            "optimized": sum(p["status"] == "optimized" for p in pieces),
            "kernels": res.stats.get("kernels"), "baseline": res.baseline_cost_us,
            "cost": res.cost_us, "bound": res.verified.false_positive_bound,
            "verified": res.verified.equivalent, "seconds": seconds,
            "error": check(res) if check else None, "compiled": compiled}


def through_compile(model, x, time_limit_s: float, cache) -> str:
    """torch.compile(model, backend=em.backend): "N/M ops optimized, error E" vs eager."""
    import warnings

    import torch

    torch._dynamo.reset()
    be = em.backend(time_limit_s=time_limit_s, cache=cache, warn=False, warmup=0)  # one call
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got, want = torch.compile(model, backend=be)(x), model(x)
    s = be.summary()
    err = float((got - want).abs().max() / want.abs().max())
    return f"{s['optimized_ops']}/{s['ops']} ops, error {err:.1e}"


def eager_error(model, x):
    """A ``check`` for ``run_one``: max |stitched - eager| / max |eager| in float32."""
    import numpy as np
    import torch

    from eqsat_mirage.frontend.from_torch import graph_inputs

    def check(res) -> float:
        with torch.no_grad():
            want = model(x).numpy()
        feed = {k: v.detach().numpy() for k, v in graph_inputs(res.source, model, x).items()}
        got = em.evaluate(res.program, feed, dtype="float32")
        (out,) = got.values()
        return float(np.max(np.abs(out - want)) / np.max(np.abs(want)))
    return check


def table(rows: list[dict]) -> str:
    """The results as a markdown table."""
    lines = ["| program | ops | pieces (distinct) | optimized | kernels | one kernel per op us "
             "| chosen us | ratio | bound | max rel. error vs eager | search s | torch.compile |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        err = f"{r['error']:.1e}" if r["error"] is not None else "-"
        lines.append(f"| {r['name']} | {r['ops']} | {r['pieces']} ({r['distinct']}) | "
                     f"{r['optimized']} | {r['kernels']} | {r['baseline']:.2f} | {r['cost']:.2f} "
                     f"| {r['cost'] / r['baseline']:.2f}x | {r['bound']:.1e} | {err} | "
                     f"{r['seconds']:.1f} | {r['compiled'] or '-'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    """Run the programs, print the table, optionally write it into RESULTS.md."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--time-limit", type=float, default=240.0)
    ap.add_argument("--write", metavar="RESULTS.md")
    args = ap.parse_args(argv)
    rows = [run_one("attention x2 (GQA b=1 shapes)", chained_attention(), args.time_limit)]
    print(table(rows), flush=True)
    for n in args.blocks:
        model, x = decoder_stack(n)
        graph = em.from_torch(model, x)
        rows.append(run_one(f"LLaMA-style decoder x{n} (d 512, seq 128)", graph,
                            args.time_limit, eager_error(model, x), (model, x)))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = table(rows)
    blocks = {r["name"]: r for r in rows if "decoder" in r["name"]}
    first, last = (list(blocks.values())[i] for i in (0, -1)) if blocks else (None, None)
    if first is not last:
        text += (f"\n\nSearch time, {last['name'].split(' (')[0]} over "
                 f"{first['name'].split(' (')[0]}: {last['seconds'] / first['seconds']:.2f}x "
                 "(equal blocks cut into equal pieces, each distinct piece searched once). "
                 "Ops are the em.Graph's; the torch.compile column counts Dynamo's fx ops "
                 "(a Linear is one), all in optimized partitions, compared with eager fp32.")
    if args.write:
        from bench.results_md import replace_section

        body = (f"{SECTION}\n\nCommand: `python bench/whole_programs.py --write "
                f"bench/RESULTS.md`. Machine: "
                f"{platform.machine()} CPU, {platform.python_version()} (cost-model figures for "
                f"h100; search seconds are wall clock on this machine, fresh cache).\n\n{text}\n")
        replace_section(Path(args.write), SECTION, body)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
