"""A 64-step decode loop through torch.compile(backend=em.backend): the KV length grows
4096..4159, GQA (16 query heads over 4 KV heads, head dim 64), fp16.

    python bench/decode_bench.py [--steps 64] [--write bench/RESULTS.md]

Runs the loop twice, with ``dynamic=True`` and with Dynamo's defaults (automatic dynamic
shapes: the first length compiles static and runs eagerly, the backend's warmup; the
second recompiles with the length symbolic). For each: the family and static searches
run, the seconds of the steps that compiled (search, verification at six sizes, build),
each step's time against eager torch in the same run, and each step's error against a
float32 reference next to eager fp16's own error. On a machine without a GPU the
partitions run as torch ops (the backend's CPU engine), so the per-step times measure the
backend's overhead on CPU, not kernel speed. Then the tiny LlamaForCausalLM decode of
bench/hf_models.py, and the host time per call of the family's Triton launcher (its
kernels replaced by no-ops).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

os.environ.setdefault("EQSAT_MIRAGE_COMPILE_CHECK", "0")

import torch  # noqa: E402

import eqsat_mirage as em  # noqa: E402
from eqsat_mirage.dynamo.report import counted  # noqa: E402

HQ, HKV, D, L0 = 16, 4, 64, 4096


class DecodeStep(torch.nn.Module):
    """One decode step: attention of one query token (GQA), then the output projection
    (a parameter, so Dynamo keeps its sizes static)."""

    def __init__(self) -> None:
        super().__init__()
        self.o_proj = torch.nn.Linear(HQ * D, HQ * D, bias=False)

    def forward(self, q, k, v):
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return self.o_proj(o.reshape(1, HQ * D))


def run(dynamic, steps: int, device: str) -> dict:
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(0)
    dt = torch.float16
    kc = torch.randn(1, HKV, L0 + steps, D, generator=gen).to(device, dt)
    vc = torch.randn(1, HKV, L0 + steps, D, generator=gen).to(device, dt)
    torch.manual_seed(0)
    step = DecodeStep().to(device, dt).eval()
    ref_step = DecodeStep().to(device).eval()
    ref_step.load_state_dict(step.state_dict())  # float32 copy of the same weights
    qs = [torch.randn(1, HQ, 1, D, generator=gen).to(device, dt) for _ in range(steps)]
    be = em.backend(warn=False)
    fast = torch.compile(step, backend=be, dynamic=dynamic)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows = []
    with torch.no_grad():
        for i in range(steps):
            n = L0 + i
            k, v = kc[:, :, :n], vc[:, :, :n]
            sync()
            t0 = time.perf_counter()
            eager = step(qs[i], k, v)
            sync()
            t1 = time.perf_counter()
            got = fast(qs[i], k, v)
            sync()
            t2 = time.perf_counter()
            ref = ref_step(qs[i].float(), k.float(), v.float())
            rows.append((n, t1 - t0, t2 - t1, (got.float() - ref).abs().max().item(),
                         (eager.float() - ref).abs().max().item()))
    fams = [e for e in be.report if getattr(e.result, "scaling", None) is not None]
    fam = fams[0].result.stats["family"] if fams else {}
    return {"rows": rows, "families": sum(counted(e) for e in fams),
            "static": sum(counted(e) for e in be.report if e not in fams),
            "report": be.report, "family": fam,
            "search_s": [round(e.seconds, 1) for e in be.report],
            "eager_calls": sum(e.eager_calls for e in be.report)}


def hf_decode(steps: int) -> list[str]:
    """The tiny LlamaForCausalLM decode (bench/hf_models.py) under Dynamo's defaults."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.hf_models import decode

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = decode(steps=steps)
    dyn = r["summary"]["graphs"][-1]
    fams = [e for e in r["families"] if counted(e)]
    fam = fams[0].result.stats["family"] if fams else {}
    line = (f"Tiny `LlamaForCausalLM` (2 layers, hidden 256, 4 heads over 2 KV heads, fp32), "
            f"64-token eager prefill, then {steps} decode steps through torch.compile with "
            f"Dynamo's defaults: the recompiled graph runs {dyn['optimized_ops']} of "
            f"{dyn['compute_ops']} compute ops in {dyn['optimized_partitions']} optimized "
            f"partitions ({len(fams)} of them families: each layer's attention over the "
            f"cache; the cache's torch.cat stays eager), predicted {dyn['predicted_us'][0]:.1f}"
            f" -> {dyn['predicted_us'][1]:.1f} us; max error against eager "
            f"{max(r['errors']):.1e} (relative); the first step (eager: warmup) "
            f"{r['seconds'][0]:.1f} s, the compile step {r['seconds'][1]:.1f} s, later "
            "steps median "
            f"{statistics.median(r['seconds'][2:]) * 1e3:.0f} ms")
    if fam:
        line += (f"; the attention family: granule {fam['granule']}, predicted "
                 f"{fam['cost_us'][min(fam['cost_us'])]:.2f} us against "
                 f"{fams[0].result.baseline_cost_us:.2f} us one kernel per op")
    print(line, flush=True)
    return [line + "."]


class _NoLaunch:
    """A kernel whose launches do nothing (the launcher's host work is what is timed)."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def launcher_overhead(reps: int = 400) -> str:
    """Host time per call of the decode GQA family's launcher, its kernels replaced by
    no-ops, on CPU tensors at L = 4097: the one module serving every L, the module written
    for L's padded size only, and the static module of the plan at that padded size."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.gpu_bundle import decode_family
    from eqsat_mirage.codegen.source import load_source, triton_source
    from eqsat_mirage.family.runner import FamilyRunner

    res = em.optimize(decode_family(HKV, HQ // HKV, D, L0), time_limit_s=60)
    fr = FamilyRunner(res.family, res.scaling)
    n = L0 + 1
    lp = res.scaling.padded(n)
    mods = {"one module, every L": load_source(fr.source()),
            "one padded size": load_source(fr.padded_source(lp)),
            "static plan (that padded size, inputs padded)": load_source(triton_source(
                res.scaling.at(lp)))}
    gen = torch.Generator().manual_seed(0)
    shapes = {"Q": (1, HKV, HQ // HKV, D), "K": (1, HKV, D, n), "V": (1, HKV, n, D)}
    x = {k: torch.randn(s, generator=gen).half() for k, s in shapes.items()}
    padded = {k: torch.nn.functional.pad(v, (0, lp - n) if k == "K" else (0, 0, 0, lp - n))
              if k != "Q" else v for k, v in x.items()}
    os.environ["TRITON_INTERPRET"] = "1"  # the launcher's device check (nothing runs)
    out = []
    for label, run in mods.items():
        for attr in [a for a in vars(run.module) if a.endswith("_kernel")]:
            setattr(run.module, attr, _NoLaunch())
        args = padded if label.startswith("static") else x
        run(**args)
        times = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(reps):
                run(**args)
            times.append((time.perf_counter() - t) / reps * 1e6)
        out.append(f"{label} {statistics.median(times):.1f} us")
    line = (f"Launcher host time per call (GQA decode family above, L = {n}, kernels replaced by "
            f"no-ops, CPU tensors, median of 5 x {reps} calls): " + "; ".join(out))
    print(line, flush=True)
    return [line + "."]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--write", help="replace the 'Decoding through torch.compile' section")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    machine = torch.cuda.get_device_name() if device == "cuda" else \
        f"CPU ({os.cpu_count()} cores), torch engine"
    lines = ["## Decoding through torch.compile (issue 16)", "",
             f"`python bench/decode_bench.py --write bench/RESULTS.md`; {machine}; "
             f"GQA {HQ} query heads over {HKV} KV heads, head dim {D}, fp16, KV length "
             f"{L0}..{L0 + args.steps - 1}, then a {HQ * D}x{HQ * D} projection. Times in "
             "one run; per-step medians skip the steps that compiled. The attention is one "
             "family (one search for every length); the projection is a static program "
             "of its own. With the defaults, the first length's static graph runs its one "
             "call eagerly (the backend's warmup) and is never searched; the compile steps "
             "are that eager call and the recompiled graph's first call.", "",
             "| Dynamo setting | family searches | static searches | compile steps, s | "
             "eager step, ms | compiled step, ms | added over eager, 64 steps, s | "
             "max error (eager's) | eager calls |", "|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for label, dynamic in (("dynamic=True", True), ("defaults (automatic dynamic)", None)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = run(dynamic, args.steps, device)
        rows = r["rows"]
        first = 1 if dynamic else 2  # the steps that compiled
        eager_ms = statistics.median(x[1] for x in rows[first:]) * 1e3
        fast_ms = statistics.median(x[2] for x in rows[first:]) * 1e3
        added = sum(x[2] - x[1] for x in rows)
        compile_s = " + ".join(f"{x[2]:.1f}" for x in rows[:first])
        err = max(x[3] for x in rows)
        own = max(x[4] for x in rows)
        lines.append(f"| {label} | {r['families']} | {r['static']} | {compile_s} | "
                     f"{eager_ms:.2f} | {fast_ms:.2f} | {added:.1f} | {err:.2e} ({own:.2e}) | "
                     f"{r['eager_calls']} |")
        print(lines[-1], flush=True)
        fam = r["family"]
        if fam:
            verified = ", ".join(str(s) for s, ok in fam["verified_sizes"].items() if ok)
            note = (f"{label}: family {fam['dim']} planned at {fam['planned_at']}, granule "
                    f"{fam['granule']}, verified at {verified} (bound "
                    f"{max(fam['bounds'].values()):.1e}); predicted cost " + ", ".join(
                        f"{c:.2f} us at {s}" for s, c in fam["cost_us"].items()))
            notes += ["", note]
            print(note, flush=True)
    notes += ["", *hf_decode(args.steps), "", *launcher_overhead()]
    text = "\n".join(lines + notes) + "\n"
    print(text)
    if args.write:
        from pathlib import Path

        from results_md import replace_section

        replace_section(Path(args.write), "## Decoding through torch.compile", text)


if __name__ == "__main__":
    main()
