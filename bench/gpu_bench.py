"""GPU timings of every benchmark: ``eqsat-mirage bench --gpu`` (issue 5).

For each (benchmark, batch) case: build the program, ``em.optimize`` it and
compile the chosen program (Triton); build the same computation as plain torch
(``torch_reference``, an interpreter of the kernel-level ``em.Graph``); time
torch eager, ``torch.compile(torch_reference)``, the compiled eqsat-mirage
program and, for gqa/qknorm, ``scaled_dot_product_attention`` (timing only:
scale=1.0, K transposed, and for qknorm without the norms). Every time is the
median of many runs after warm-up, with CUDA events, all in one process
(``/work/.library/device/METHOD.md``). ``--write FILE`` replaces the
"## GPU timings" section of FILE with the table, the device and the command.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import eqsat_mirage as em  # noqa: E402
from bench.programs import cases, program  # noqa: E402
from bench.results_md import replace_section  # noqa: E402
from eqsat_mirage.cost.gpucost import mugraph_cost  # noqa: E402
from eqsat_mirage.ir.node import ITEMSIZE, Op
from eqsat_mirage.semantics.torch_reference import torch_reference

SECTION = "## GPU timings"
NO_GPU = "bench --gpu needs a CUDA GPU (none found)"
COLUMNS = ("case", "eager us", "compile us", "sdpa us", "ours us", "predicted us",
           "vs eager", "vs compile", "DRAM frac")


def make_inputs(graph, device: str = "cuda", seed: int = 0) -> dict:
    """Random inputs (never zeros), scaled so exp() of a 64-long dot stays finite in fp16."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    out = {}
    for name, n in graph.inputs.items():
        t = torch.randn(n.shape, generator=gen) * 0.1
        out[name] = t.to(device=device, dtype=getattr(torch, n.dtype))
    return out


def time_us(fn: Callable[[], object], reps: int = 100, warmup: int = 10) -> float:
    """Median time of ``fn()`` in microseconds: CUDA events around each run, after warm-up."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def roofline(graph, prof) -> tuple[float, float, bool]:
    """(bytes moved: inputs once + outputs once, matmul FLOPs, memory-bound?) of ``graph``."""
    moved = sum(math.prod(n.shape) * ITEMSIZE[n.dtype] for n in graph.inputs.values())
    moved += sum(math.prod(n.shape) * ITEMSIZE[n.dtype]
                 for n in {id(n): n for n in graph.outputs.values()}.values())
    flops = 0.0
    for n in graph.nodes():
        if n.op is Op.MATMUL:
            a = n.srcs[0].shape
            flops += 2.0 * math.prod(n.shape) * a[-1]
    mem_s = moved / (prof.dram_bandwidth_GBps * 1e9)
    comp_s = flops / (prof.fp16_tensor_TFLOPs * 1e12)
    return moved, flops, mem_s >= comp_s


def _sdpa(name: str, inputs: dict):
    """scaled_dot_product_attention on the gqa/qknorm inputs (timing only), or None."""
    if name not in ("gqa", "qknorm"):
        return None
    import torch.nn.functional as F  # noqa: N812

    q, k, v = inputs["Q"], inputs["K"].transpose(-1, -2).contiguous(), inputs["V"]
    q, k, v = (t.unsqueeze(0) for t in (q, k, v))  # (1, heads, n, d)
    return lambda: F.scaled_dot_product_attention(q, k, v, scale=1.0)


def run_case(name: str, batch: int, reps: int, prof, optimize_kw: dict) -> dict:
    """Optimize, compile and time one case; returns a row dict (times in us)."""
    import torch

    graph = program(name, batch)
    res = em.optimize(graph, **optimize_kw)
    ours, graphed = res.compile(), res.compile(cuda_graph=True)
    ref = torch_reference(graph)
    inputs = make_inputs(graph)
    compiled = torch.compile(ref)
    got, want = ours(**inputs), ref(**inputs)
    err = max(float((got[k].float() - want[k].float()).norm() / want[k].float().norm())
              for k in want)
    row = {"case": f"{name} b={batch}", "predicted": res.cost_us, "rel_err": err,
           "eager": time_us(lambda: ref(**inputs), reps),
           "compile": time_us(lambda: compiled(**inputs), reps),
           "ours": time_us(lambda: ours(**inputs), reps),
           "ours_graph": time_us(lambda: graphed(**inputs), reps), "sdpa": None,
           "cost": mugraph_cost(res.program, prof) if hasattr(res.program, "kernels") else None}
    sdpa = _sdpa(name, inputs)
    if sdpa is not None:
        row["sdpa"] = time_us(sdpa, reps)
    moved, _, mem_bound = roofline(graph, prof)
    row["dram_frac"] = (moved / (row["ours"] * 1e-6) / (prof.dram_bandwidth_GBps * 1e9)
                        if mem_bound else None)
    return row


def _cells(row: dict) -> list[str]:
    def f(x):
        return "-" if x is None else f"{x:.1f}"
    return [row["case"], f(row["eager"]), f(row["compile"]), f(row["sdpa"]), f(row["ours"]),
            f(row["predicted"]), f"{row['eager'] / row['ours']:.2f}x",
            f"{row['compile'] / row['ours']:.2f}x",
            "-" if row["dram_frac"] is None else f"{row['dram_frac']:.2f}"]


def format_table(rows: list[dict], markdown: bool = False) -> str:
    """The rows as an aligned text table or a Markdown table."""
    body = [_cells(r) for r in rows]
    if markdown:
        lines = ["| " + " | ".join(COLUMNS) + " |",
                 "|---|" + "|".join("---:" for _ in COLUMNS[1:]) + "|"]
        return "\n".join(lines + ["| " + " | ".join(c) + " |" for c in body])
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(COLUMNS)]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(cells, widths)))
                     for cells in [list(COLUMNS), *body])


def section(rows: list[dict], device: str, command: str, reps: int) -> str:
    """The "## GPU timings" section of bench/RESULTS.md."""
    return "\n".join([
        SECTION, "",
        f"Device: {device}  ",
        f"Command: `{command}`  ",
        f"Median of {reps} runs after warm-up, CUDA events, one process; fp16 inputs. "
        "sdpa is torch's scaled_dot_product_attention (scale=1.0, K transposed; qknorm "
        "without the norms), for timing only. DRAM frac = roofline bytes / time / profile "
        "bandwidth, for memory-bound cases.", "",
        format_table(rows, markdown=True), ""])


def write_section(path: Path, text: str) -> None:
    """Replace the GPU timings section of ``path`` (or append it), keeping the rest."""
    replace_section(path, SECTION, text)


def write_calibration(path: Path, rows: list[dict], device: str, prof) -> None:
    """Fit the cost model to the measured times (``cost.calibrate``: CUDA-graph replays and
    plain launches of the chosen programs) and write ``path``, the profile's
    ``<gpu>_measured.toml`` that ``GPUProfile.load`` reads."""
    from eqsat_mirage.cost.calibrate import Sample, fit, write_measured

    samples = [Sample(r["case"], r["cost"], r["ours_graph"], r["ours"]) for r in rows
               if r.get("cost") is not None]
    fitted = fit(samples, prof)
    write_measured(path, fitted, device)
    print(f"calibration: {fitted.residual:.1%} rms error of the fit; {fitted.figures}")


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The command-line options (shared with ``eqsat-mirage bench``)."""
    parser = parser or argparse.ArgumentParser(
        prog="gpu_bench.py", description="Time every benchmark on a CUDA GPU.")
    parser.add_argument("--gpu", action="store_true", help="time on the CUDA GPU (required)")
    parser.add_argument("--bench", action="append", default=None, metavar="NAME",
                        help="only this benchmark (repeatable; default: all six)")
    parser.add_argument("--batch", type=int, action="append", default=None, metavar="B",
                        help="only this batch size (repeatable; default: 1 and 8)")
    parser.add_argument("--reps", type=int, default=100, help="timed runs (default 100)")
    parser.add_argument("--target", default="h100", help="hardware profile (default h100)")
    parser.add_argument("--time-limit", type=float, default=60.0,
                        help="wall-clock seconds per search (default 60)")
    parser.add_argument("--write", type=Path, default=None, metavar="FILE",
                        help="replace FILE's GPU timings section with the table")
    parser.add_argument("--calibration", type=Path, default=None, metavar="FILE",
                        help="fit the cost model to the measured times and write FILE "
                             "(copied to extract/<gpu>_measured.toml, the cost model reads it; "
                             "the H200's there is the ranking fit: see docs/gpu.md)")
    return parser


def run(args: argparse.Namespace, command: str) -> int:
    """Time the selected cases; 0 on success (errors raise ``em.MirageError``)."""
    if not args.gpu:
        raise em.MirageError("bench: only --gpu is supported (e.g. eqsat-mirage bench --gpu)")
    import torch

    if not torch.cuda.is_available():
        raise em.MirageError(NO_GPU)
    from eqsat_mirage.cost.profile import GPUProfile

    selected = [(n, b) for n, b in cases() if (args.bench is None or n in args.bench)
                and (args.batch is None or b in args.batch)]
    if not selected:
        raise em.MirageError(f"no benchmark case matches --bench {args.bench} "
                             f"--batch {args.batch}")
    prof = GPUProfile.load(args.target)
    device = torch.cuda.get_device_name()
    print(f"timing {len(selected)} cases on {device}, {args.reps} runs each", flush=True)
    kw = dict(target=args.target, time_limit_s=args.time_limit)
    rows = []
    for name, batch in selected:
        rows.append(run_case(name, batch, args.reps, prof, kw))
        print(f"  {rows[-1]['case']}: ours {rows[-1]['ours']:.1f} us, "
              f"rel err {rows[-1]['rel_err']:.1e}", flush=True)
    print()
    print(format_table(rows))
    if args.write is not None:
        write_section(args.write, section(rows, device, command, args.reps))
        print(f"\nwrote the GPU timings section of {args.write}")
    if args.calibration is not None:
        write_calibration(args.calibration, rows, device, prof)
        print(f"wrote {args.calibration}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python bench/gpu_bench.py --gpu``."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    try:
        return run(args, " ".join(["python bench/gpu_bench.py", *argv]))
    except em.MirageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
