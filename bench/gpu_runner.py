"""Run a GPU bundle (``bench/gpu_bundle.py export``) where only torch and triton exist.

    python3 gpu_runner.py BUNDLE --out RESULTS.json [--reps 200] [--sets 4] [--max-autotune]

The GPU machine has torch and triton but not this project's dependencies, so
the bundle carries, per benchmark case, the Triton module of the chosen
program (``*_ours.py``) and the one-kernel-per-op torch module of the input
program (``*_ref.py``: eager torch, one library call per op), both generated
here, plus ``manifest.json``. For every case this script:

- draws ``--sets`` input sets (never zeros; each input at its manifest scale);
- checks correctness on each set against the reference recomputed in float64,
  beside eager in the input's own dtypes: more non-finite outputs (where the
  reference is finite) than eager has, or a relative error ``|out - ref| / |ref|``
  above both 2e-3 and 1.5 times eager's own, fails the case (exit code 1);
- poisons every buffer the module allocates with ``torch.empty`` or
  ``Tensor.new_empty`` (its outputs and intermediates) with NaN during the
  checked runs, so an element no kernel writes shows as non-finite;
- times eager, ``torch.compile`` of the eager module (and max-autotune with the
  flag), ours, and SDPA where the manifest names Q, K, V: every contestant as
  CUDA-graph replays timed with CUDA events (median over ``--reps``, rotating
  over the input sets so that L2 does not hold one set), and ours also as plain
  launches from Python (host overhead included);
- writes everything to ``--out`` as JSON (``gpu_bundle.py ingest`` reads it).

The manifest's ``families`` (the decode family: a KV cache growing one token per step)
run step by step (``run_family``): each length through the family's one module (its
launcher computes the padded size and grids from L), checked against float64, timed per
step as plain launches beside eager torch and SDPA.

The manifest's ``tuning`` groups (``gpu_tuning.py``: each piece's top verified candidates
and its eager form) run last (``run_group``): each candidate's first launch is checked
against float64 beside the eager module (the rule of a case); the correct ones and the eager
form are timed as CUDA-graph replays (median of the manifest's ``tune.reps``, or
``--tune-reps``); the row names the fastest (``tuned``). ``--no-tune`` skips them.

``--device cpu`` runs the correctness part alone (TRITON_INTERPRET=1 must be set
before triton loads), which is how CI tests this script. It imports nothing of
eqsat_mirage, and it executes only the bundle's modules, which this project generated.
With ``--stub-times`` a CPU run gives each tuning program a made-up time (its predicted time
times ``STUB_FACTORS`` by rank), so that the ingest step can be tested without a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

TOLERANCE = 2e-3
SAFER_TOLERANCE = 1e-2  # ours finite where eager overflows: float64 is the only yardstick
FAMILY_TOLERANCE = 1e-2  # fp16 inputs over a 4096-long softmax: float16 rounding of P @ V
# --stub-times: candidate #i's made-up time is its predicted time times factor i (the eager
# form's, its predicted time), so the made-up fastest is not always the model's choice
STUB_FACTORS = (1.0, 0.8, 1.2, 0.9, 1.1, 0.7, 1.3, 1.05)


def load(path: Path, name: str):
    """The generated module at ``path``, imported under ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def draw(case: dict, device: str, seed: int) -> dict:
    """One input set, in each input's dtype, on ``device``: N(0, 1) times its scale (clamped
    to +-``clamp`` where given), or integers over ``range`` [lo, hi], or uniform over
    ``uniform`` [lo, hi]."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)

    def one(spec):
        if "range" in spec:
            lo, hi = spec["range"]
            x = torch.randint(lo, hi + 1, spec["shape"], generator=gen, dtype=torch.int64)
        elif "uniform" in spec:
            lo, hi = spec["uniform"]
            x = torch.rand(spec["shape"], generator=gen, dtype=torch.float64) * (hi - lo) + lo
        else:
            x = torch.randn(spec["shape"], generator=gen, dtype=torch.float64) * spec["scale"]
            if "clamp" in spec:
                x = x.clamp(-spec["clamp"], spec["clamp"])
        return x.to(device=device, dtype=getattr(torch, spec["dtype"]))

    return {name: one(spec) for name, spec in case["inputs"].items()}


class _Poisoned:
    """``torch`` for a generated module, except that ``empty`` fills with NaN."""

    def __init__(self, torch) -> None:
        self._torch = torch

    def __getattr__(self, name: str):
        return getattr(self._torch, name)

    def empty(self, *args, **kwargs):
        return _nan_filled(self._torch.empty(*args, **kwargs))


def _nan_filled(t):
    """``t`` filled with NaN where it holds floats (integer buffers as they are)."""
    return t.fill_(float("nan")) if t.is_floating_point() else t


@contextlib.contextmanager
def poisoned(module):
    """``module``'s allocations (``torch.empty`` in it, ``Tensor.new_empty`` anywhere) filled
    with NaN for the duration."""
    import torch

    new_empty = torch.Tensor.new_empty

    def poisoned_new_empty(self, *args, **kwargs):
        return _nan_filled(new_empty(self, *args, **kwargs))

    module.torch, torch.Tensor.new_empty = _Poisoned(torch), poisoned_new_empty
    try:
        yield
    finally:
        module.torch, torch.Tensor.new_empty = torch, new_empty


def reference64(ref, inputs: dict) -> dict:
    """The eager module recomputed in float64 (its dtype checks widened to float64)."""
    import torch

    saved, module_torch = ref.INPUTS, ref.torch
    ref.INPUTS = {n: (shape, torch.float64) for n, (shape, _) in saved.items()}
    ref.torch = _Float64(torch)  # the program's own casts (x.to(torch.float16)) stay wide
    try:
        return ref.run(**{n: x.double() for n, x in inputs.items()})
    finally:
        ref.INPUTS, ref.torch = saved, module_torch


class _Float64:
    """``torch`` with its floating dtypes read as float64 (``reference64``)."""

    def __init__(self, torch):
        self._torch = torch

    def __getattr__(self, name):
        if name in ("float16", "bfloat16", "float32", "half", "float"):
            return self._torch.float64
        return getattr(self._torch, name)


def check(got: dict, want: dict) -> tuple[float, int]:
    """(largest relative error over the outputs, non-finite outputs where want is finite)."""
    import torch

    err, bad = 0.0, 0
    for name, w in want.items():
        g = got[name].double()
        bad += int((~torch.isfinite(g) & torch.isfinite(w)).sum())
        err = max(err, float((g - w).norm() / max(float(w.norm()), 1e-300)))
    return err, bad


def graph_time_us(fn, sets: list[dict], reps: int) -> float:
    """Median CUDA-event time of one replay of ``fn`` captured once per input set."""
    import torch

    graphs = []
    for inputs in sets:
        for _ in range(3):  # warm up: compilation and allocations stay out of the capture
            fn(inputs)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn(inputs)
        graphs.append(g)
    times = []
    for r in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graphs[r % len(graphs)].replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def plain_time_us(fn, sets: list[dict], reps: int) -> float:
    """Median time of one call of ``fn`` from Python (launches and host work included)."""
    import torch

    for inputs in sets:
        fn(inputs)
    torch.cuda.synchronize()
    times = []
    for r in range(reps):
        t = time.perf_counter()
        fn(sets[r % len(sets)])
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times)


def run_case(folder: Path, case: dict, device: str, args) -> dict:
    """Check and (on CUDA) time one case; a result row."""
    import torch

    ours = load(folder / case["ours"], f"ours_{case['id']}")
    ref = load(folder / case["ref"], f"ref_{case['id']}")
    sets = [draw(case, device, seed) for seed in range(args.sets)]
    row = {"case": case["case"], "rel_err": 0.0, "nonfinite": 0, "eager_rel_err": 0.0,
           "eager_nonfinite": 0}
    for inputs in sets:
        with poisoned(ours):
            got = ours.run(**inputs)
        want = reference64(ref, inputs)
        err, bad = check(got, want)
        row["rel_err"], row["nonfinite"] = max(row["rel_err"], err), row["nonfinite"] + bad
        err, bad = check(ref.run(**inputs), want)  # eager in the input's own dtypes
        row["eager_rel_err"] = max(row["eager_rel_err"], err)
        row["eager_nonfinite"] += bad
    row["ok"] = accurate(row["rel_err"], row["nonfinite"], row["eager_rel_err"],
                         row["eager_nonfinite"])
    if device != "cuda":
        return row
    if args.ours_only:  # a schedule sweep: the variants alone
        row["ours_us"] = graph_time_us(lambda x: ours.run(**x), sets, args.reps)
        return row
    compiled = torch.compile(ref.run)
    contestants = {"eager": ref.run, "compile": compiled, "ours": ours.run}
    if args.max_autotune:
        contestants["compile_max"] = torch.compile(ref.run, mode="max-autotune-no-cudagraphs")
    if case.get("sdpa"):
        import torch.nn.functional as F  # noqa: N812

        q, k, v = case["sdpa"]

        def sdpa(**x):
            return F.scaled_dot_product_attention(x[q].unsqueeze(0),
                                                  x[k].transpose(-1, -2).unsqueeze(0),
                                                  x[v].unsqueeze(0), scale=1.0)
        contestants["sdpa"] = sdpa
    for name, fn in contestants.items():
        try:  # one contestant that fails (a torch.compile error, say) leaves the others
            row[f"{name}_us"] = graph_time_us(lambda x, fn=fn: fn(**x), sets, args.reps)
        except Exception as exc:  # noqa: BLE001 - recorded in the row, the run goes on
            row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:500]
    row["ours_plain_us"] = plain_time_us(lambda x: ours.run(**x), sets, args.reps)
    return row


def accurate(err: float, bad: int, eager_err: float, eager_bad: int) -> bool:
    """A case's rule: finite wherever eager is, and within the tolerance or no less
    accurate than eager (1.5 times its relative error). Where eager overflows at outputs
    ours computes finite, eager's error there is unbounded (its relative error, taken over
    the rest, may be 0): ours is then held to ``SAFER_TOLERANCE`` against float64."""
    if bad > eager_bad:
        return False
    bound = max(TOLERANCE, 1.5 * eager_err)
    return err <= (max(bound, SAFER_TOLERANCE) if bad < eager_bad else bound)


def checked_first_launch(folder: Path, group: dict, cand: dict, inputs: dict, want: dict,
                         eager: tuple[float, int]):
    """One candidate of a tuning group loaded and its first launch (allocations poisoned)
    checked against ``want`` (float64): (its result entry, its module, or None when it
    raised)."""
    entry = {"name": cand["name"]}
    try:
        mod = load(folder / cand["module"], f"tune_{group['id']}_{cand['module'][:-3]}")
        with poisoned(mod):
            got = mod.run(**inputs)
        err, bad = check(got, want)
    except Exception as exc:  # noqa: BLE001 - a candidate that does not run is dropped
        entry.update(ok=None, error=f"{type(exc).__name__}: {exc}"[:500])
        return entry, None
    entry.update(rel_err=err, nonfinite=bad, ok=accurate(err, bad, *eager))
    return entry, mod


def run_group(folder: Path, group: dict, device: str, args) -> dict:
    """One tuning group: every candidate's first launch checked (``checked_first_launch``);
    on CUDA the correct ones and the eager form timed as CUDA-graph replays (``us``, the
    median; with ``--stub-times`` on a CPU a made-up time); ``tuned`` names the fastest."""
    t0 = time.perf_counter()
    ref = load(folder / group["ref"], f"tref_{group['id']}")
    sets = [draw(group, device, seed) for seed in range(args.sets)]
    want = reference64(ref, sets[0])
    eager = check(ref.run(**sets[0]), want)
    row = {"id": group["id"], "case": group["case"], "piece": group["piece"],
           "eager_rel_err": eager[0], "eager_nonfinite": eager[1], "candidates": []}
    timed = {}  # the candidates in the model's order, then eager: the earlier wins a tie
    for i, cand in enumerate(group["candidates"]):
        entry, mod = checked_first_launch(folder, group, cand, sets[0], want, eager)
        row["candidates"].append(entry)
        if entry["ok"]:
            timed[cand["name"]] = (mod.run, cand["predicted_us"] * STUB_FACTORS[
                i % len(STUB_FACTORS)])
    timed["eager"] = (ref.run, group["eager_predicted_us"])
    reps = args.tune_reps or args.manifest_tune.get("reps", 100)
    times = {}
    for name, (fn, stub) in timed.items():
        if device == "cuda":
            try:
                times[name] = graph_time_us(lambda x, fn=fn: fn(**x), sets, reps)
            except Exception as exc:  # noqa: BLE001 - recorded, the others go on
                row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:500]
        elif args.stub_times:
            times[name] = stub
    for entry in row["candidates"]:
        if entry["name"] in times:
            entry["us"] = times[entry["name"]]
    if "eager" in times:
        row["eager_us"] = times["eager"]
    if times:
        row["tuned"] = min(times, key=times.get)
    row["ok"] = all(e["ok"] is not False for e in row["candidates"])
    row["seconds"] = time.perf_counter() - t0
    return row


def ceilings() -> dict:
    """The device's two ceilings, measured (METHOD.md): a device-to-device copy (bytes read
    plus written per second) and a float16 matrix product on random data (FLOP/s)."""
    import torch

    a = torch.randn(2**28, device="cuda", dtype=torch.float16)  # 512 MiB
    b = torch.empty_like(a)
    m = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    out = {}
    for name, fn, work in (("copy_GBps", lambda: b.copy_(a), 2 * a.numel() * 2 / 1e9),
                           ("fp16_matmul_TFLOPs", lambda: m @ m, 2 * 8192**3 / 1e12)):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            fn()
        end.record()
        end.synchronize()
        out[name] = work / (start.elapsed_time(end) / 10 / 1e3)
    return out


def guarded(fn, label: str, *args) -> dict:
    """``fn(*args)``'s row, or a failed row naming the error (one case that raises, a
    Triton version that refuses a kernel, say, never stops the others)."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - recorded in the row, the run goes on
        import traceback

        return {"case": label, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:800],
                "trace": traceback.format_exc()[-2000:]}


def run_family(folder: Path, fam: dict, device: str, args) -> dict:
    """The decode family: L grows one step at a time; each step runs the family's module
    (key "0": one serving every L; else the module of L's padded size) on K and V cut to L
    (views of one cache, no copy), checked against float64 softmax attention; on CUDA each
    step is timed as plain launches (the median over the steps) beside eager torch and
    SDPA on the same views."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    mods = {int(lp): load(folder / name, f"fam_{lp}") for lp, name in fam["modules"].items()}
    gen = torch.Generator(device="cpu").manual_seed(0)
    full = {n: torch.randn(shape, generator=gen, dtype=torch.float64)
            for n, shape in fam["inputs"].items()}
    q, kc, vc = (full[n].to(device=device, dtype=torch.float16) for n in ("Q", "K", "V"))
    row = {"case": fam["case"], "rel_err": 0.0, "nonfinite": 0}
    times = {"ours": [], "eager": [], "sdpa": []}
    kv, group, d = q.shape[1], q.shape[2], q.shape[3]
    for n in range(fam["first"], fam["first"] + fam["steps"]):
        k, v = kc[..., :n], vc[:, :, :n]
        mod = mods.get(0) or mods[-(-n // fam["granule"]) * fam["granule"]]

        def ours(mod=mod, k=k, v=v):
            return mod.run(Q=q, K=k, V=v)["O"]

        def eager(k=k, v=v):
            return torch.softmax((q @ k).float() * fam["scale"], -1).to(q.dtype) @ v

        def sdpa(k=k, v=v):
            return F.scaled_dot_product_attention(
                q.reshape(1, kv * group, 1, d), k.transpose(-1, -2), v, scale=fam["scale"],
                enable_gqa=True)
        want = torch.softmax(full["Q"] @ full["K"][..., :n] * fam["scale"], -1) @ \
            full["V"][:, :, :n]
        got = ours().double().cpu()
        row["nonfinite"] += int((~torch.isfinite(got)).sum())
        err = float((got - want).abs().max() / want.abs().max())
        row["rel_err"] = max(row["rel_err"], err)
        if device == "cuda":
            for name, fn in (("ours", ours), ("eager", eager), ("sdpa", sdpa)):
                times[name].append(plain_time_us(lambda _, fn=fn: fn(), [None], args.reps // 10
                                                 or 1))
    row["ok"] = row["nonfinite"] == 0 and row["rel_err"] <= FAMILY_TOLERANCE
    for name, ts in times.items():
        if ts:
            row[f"{name}_us"] = statistics.median(ts)
    return row


def main(argv: list[str] | None = None) -> int:
    """Run every case of the bundle; 0 when all are correct, 1 otherwise."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--sets", type=int, default=4)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--max-autotune", action="store_true")
    ap.add_argument("--only", action="append", help="run the cases whose id starts so")
    ap.add_argument("--skip", action="append", default=[],
                    help="leave out the cases and groups whose id starts so (repeatable)")
    ap.add_argument("--ours-only", action="store_true",
                    help="time only the bundle's own modules (a schedule sweep)")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="skip the cases left once this many seconds have passed")
    ap.add_argument("--tune-reps", type=int, default=0,
                    help="replays per tuning program (default: the manifest's, budgeted)")
    ap.add_argument("--no-tune", action="store_true", help="skip the tuning groups")
    ap.add_argument("--tune-only", action="store_true",
                    help="only the tuning groups (no cases, no decode family)")
    ap.add_argument("--stub-times", action="store_true",
                    help="on a CPU, made-up times for the tuning programs (tests of ingest)")
    args = ap.parse_args(argv)
    began = time.perf_counter()
    import torch
    import triton

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_runner: no CUDA device (use --device cpu for the correctness part)",
              file=sys.stderr)
        return 2
    manifest = json.loads((args.bundle / "manifest.json").read_text())
    args.manifest_tune = manifest.get("tune") or {}
    out = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
           "torch": torch.__version__, "triton": triton.__version__,
           "cuda": getattr(torch.version, "cuda", None),
           "manifest": manifest.get("made"), "cases": [], "skipped": []}
    if args.device == "cuda":
        out["ceilings"] = guarded(ceilings, "ceilings")
        torch.cuda.empty_cache()
        print(json.dumps(out["ceilings"]), flush=True)
    def wanted(item: dict) -> bool:  # selected by --only, and started within --budget-s
        if args.only and not any(item["id"].startswith(o) for o in args.only):
            return False
        if any(item["id"].startswith(o) for o in args.skip):
            return False
        if args.budget_s and time.perf_counter() - began > args.budget_s:
            out["skipped"].append(item.get("id", item["case"]) if "piece" in item
                                  else item["case"])
            return False
        return True

    for case in filter(wanted, [] if args.tune_only else manifest["cases"]):
        row = guarded(run_case, case["case"], args.bundle, case, args.device, args)
        out["cases"].append(row)
        print(json.dumps(row), flush=True)
        args.out.write_text(json.dumps(out, indent=1))  # partial results survive a time-out
    out["families"] = []
    for fam in filter(wanted, [] if args.tune_only else manifest.get("families", [])):
        row = guarded(run_family, fam["case"], args.bundle, fam, args.device, args)
        out["families"].append(row)
        print(json.dumps(row), flush=True)
        args.out.write_text(json.dumps(out, indent=1))
    out["tuning"] = []
    for group in filter(wanted, [] if args.no_tune else manifest.get("tuning", [])):
        row = guarded(run_group, group["id"], args.bundle, group, args.device, args)
        out["tuning"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "candidates"}), flush=True)
        args.out.write_text(json.dumps(out, indent=1))
    failed = [r["case"] for r in out["cases"] + out["families"] if not r["ok"]]
    failed += [r.get("id", r["case"]) for r in out["tuning"] if not r["ok"]]
    print(f"{len(out['cases'])} cases, {len(out['tuning'])} tuning groups, {len(failed)} "
          "failed" + (f": {failed}" if failed else "")
          + (f"; skipped for time: {out['skipped']}" if out["skipped"] else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
