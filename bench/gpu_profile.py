"""Where a bundle case's GPU time goes, kernel by kernel (torch.profiler), for ours and
for the one-torch-call-per-op reference. Imports nothing of eqsat_mirage: it runs on the
GPU machine beside ``gpu_runner.py`` (docs/gpu.md), from the bundle folder:

    python3 gpu_profile.py . --only llama7b_s128 [--runs 10] [--top 15] [--compile]

Each module is run three times to warm up (Triton compiles on the first call), then
``--runs`` times under the profiler; the table gives each device kernel's name, its calls
per run and its mean microseconds per run, largest first, and the sum over all kernels.
``--compile`` profiles torch.compile of the reference too (its default mode, as the runner
times it): which kernels the contestant we are held to launches.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def kernel_times(fn, inputs: dict, runs: int) -> dict[str, tuple[float, float]]:
    """name -> (calls per run, device microseconds per run) of the kernels ``fn`` launches."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn(**inputs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            fn(**inputs)
        torch.cuda.synchronize()
    calls: dict[str, int] = defaultdict(int)
    us: dict[str, float] = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            calls[ev.name] += 1
            us[ev.name] += ev.time_range.elapsed_us()
    return {n: (calls[n] / runs, us[n] / runs) for n in us}


def table(title: str, times: dict, top: int) -> list[str]:
    """The ``top`` kernels by time, and the total, as text lines."""
    rows = sorted(times.items(), key=lambda kv: -kv[1][1])
    lines = [f"{title}: {sum(t for _, t in times.values()):.1f} us of kernels per run"]
    lines += [f"  {t:9.1f} us  x{c:g}  {name[:90]}" for name, (c, t) in rows[:top]]
    return lines


def main(argv: list[str] | None = None) -> int:
    """Profile the selected cases of a bundle; print the tables, write them as JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--only", action="append", required=True)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compile", action="store_true",
                    help="profile torch.compile of the reference too")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(args.bundle.resolve()))
    from gpu_runner import draw, load

    manifest = json.loads((args.bundle / "manifest.json").read_text())
    found = {}
    for case in manifest["cases"]:
        if not any(case["id"].startswith(p) for p in args.only):
            continue
        inputs = draw(case, "cuda", 0)
        runs = {side: load(args.bundle / case[side], f"{case['id']}_{side}").run
                for side in ("ours", "ref")}
        if args.compile:
            import torch

            runs["compile"] = torch.compile(runs["ref"])
        for side, fn in runs.items():
            times = kernel_times(fn, inputs, args.runs)
            found[f"{case['id']} {side}"] = times
            print("\n".join(table(f"{case['case']} {side}", times, args.top)), flush=True)
    if args.out:
        args.out.write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
