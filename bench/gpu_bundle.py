"""The GPU protocol's two ends on this machine: export a bundle, ingest its results.

    python bench/gpu_bundle.py export gpu_bundle [--bench gqa] [--batch 1] [--target h100]
    # on the GPU machine (torch and triton only; see docs/gpu.md):
    python3 gpu_bundle/gpu_runner.py gpu_bundle --out $OUT/gpu.json
    python bench/gpu_bundle.py ingest gpu_bundle gpu.json --write bench/RESULTS.md \\
        --calibration bench/h100_measured_<date>.toml

``export`` optimizes every selected benchmark case here (and, unless ``--no-decode``,
the decode family: GQA over a KV cache growing 4096..4159, one Triton module per padded
size) (the results cache
makes a rerun fast), writes the chosen program's Triton module and the input
program's one-kernel-per-op torch module for each, a ``manifest.json`` with the
inputs (shape, dtype, scale), the predicted, baseline and roofline times and
the bytes each case must move at least, and copies ``bench/gpu_runner.py``
into the bundle. ``ingest`` turns the runner's JSON into the "## GPU timings"
section of bench/RESULTS.md and a calibration file (measured over predicted
time per case).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import eqsat_mirage as em  # noqa: E402
from bench import gpu_tuning, programs  # noqa: E402
from bench.gpu_bench import roofline, section, write_section  # noqa: E402
from bench.programs import BATCHES, SAFE, cases, program  # noqa: E402
from bench.results_md import replace_section  # noqa: E402
from eqsat_mirage.codegen.source import triton_source  # noqa: E402
from eqsat_mirage.cost.profile import GPUProfile  # noqa: E402
from eqsat_mirage.mugraph.program import from_graph  # noqa: E402
from eqsat_mirage.runtime.timing import RecordedTimer  # noqa: E402

RUNNER = Path(__file__).resolve().parent / "gpu_runner.py"


# Input scales (N(0, 1) times the scale). Mirage's six keep 0.1 (the paper's setting: GQA's
# logits then have a std of 0.08); the safe attention forms get what a model feeds them:
# unit inputs, so unscaled logits over head dim 64 have a std of 8 (QKNorm's logits come out
# of the norm at that std whatever the scale).
REALISTIC = {"gqa_safe": 1.0, "qknorm_safe": 1.0, "causal": 1.0}


def export_case(folder: Path, case_id: str, label: str, graph, res, prof,
                scale: float = 0.1, sdpa: bool = True) -> dict:
    """Write one case's two modules into ``folder``; its manifest entry (``sdpa``: time
    torch's SDPA beside it, for Q, K, V inputs without a mask)."""
    (folder / f"{case_id}_ours.py").write_text(res.triton_source(), encoding="utf-8")
    ref = from_graph(graph)
    (folder / f"{case_id}_ref.py").write_text(
        triton_source(ref, header=f"# {label}: the input program, one torch call per op"),
        encoding="utf-8")
    moved, flops, mem_bound = roofline(graph, prof)
    names = set(graph.inputs)
    return {"id": case_id, "case": label, "ours": f"{case_id}_ours.py",
            "ref": f"{case_id}_ref.py",
            "inputs": {n: {"shape": list(node.shape), "dtype": node.dtype, "scale": scale}
                       for n, node in graph.inputs.items()},
            "predicted_us": res.cost_us, "baseline_us": res.baseline_cost_us,
            "roofline_us": res.roofline_us, "min_bytes": moved, "flops": flops,
            "memory_bound": mem_bound, "kernels": len(res.program.kernels),
            "mugraph": json.loads(res.program.to_json()) if hasattr(res.program, "to_json")
            else None,  # data: the calibration re-prices it (cost/calibrate.py)
            "sdpa": ["Q", "K", "V"] if sdpa and {"Q", "K", "V"} <= names else None}


DECODE = (4, 4, 64, 4096, 64)  # KV heads, query heads per KV head, head dim, first L, steps


def decode_family(kv: int = 4, group: int = 4, d: int = 64, hint: int = 4096):
    """The decode step of GQA as a shape family: one query token per head, ``group`` query
    heads per KV head, a KV cache of length L (em.Dim), safe softmax scaled by d^-1/2."""
    g = em.Graph("decode_gqa")
    q = g.input("Q", (1, kv, group, d))
    k = g.input("K", (1, kv, d, em.Dim("L", hint=hint)))
    v = g.input("V", (1, kv, "L", d))
    g.output(em.softmax(q @ k * d ** -0.5, axis=-1) @ v, "O")
    return g


def export_family(folder: Path, target: str, time_limit_s: float, first: int = DECODE[3],
                  steps: int = DECODE[4]) -> dict:
    """The decode family's one Triton module (its launcher serves every L) and its manifest
    entry (the runner walks L = first .. first + steps - 1 one step at a time)."""
    from eqsat_mirage.family.runner import FamilyRunner

    kv, group, d = DECODE[:3]
    graph = decode_family(kv, group, d, first)
    res = em.optimize(graph, target=target, time_limit_s=time_limit_s)
    runner = FamilyRunner(res.family, res.scaling)
    lengths = range(first, first + steps)
    modules = {}
    text = runner.source()
    if runner.launcher:  # the launcher does not scale: one module per padded size
        for lp in sorted({res.scaling.padded(n) for n in lengths}):
            name = f"decode_family_{lp}.py"
            (folder / name).write_text(runner.source(lp), encoding="utf-8")
            modules[str(lp)] = name
    else:
        (folder / "decode_family.py").write_text(text, encoding="utf-8")
        modules["0"] = "decode_family.py"
    fam = res.stats["family"]
    return {"id": "decode_family", "case": f"decode GQA family, L {first}..{lengths[-1]}",
            "modules": modules, "granule": res.scaling.granule, "first": first,
            "steps": steps, "scale": d ** -0.5, "short": sorted(runner.short),
            "inputs": {"Q": [1, kv, group, d], "K": [1, kv, d, lengths[-1]],
                       "V": [1, kv, lengths[-1], d]},
            "predicted_us": {str(n): c for n, c in fam["cost_us"].items()},
            "verified": [n for n, ok in fam["verified_sizes"].items() if ok]}


def layer_scales(graph) -> dict[str, float]:
    """Input scales of a LlamaDecoderLayer partition, as the model sees them: linear weights
    (2-D, named ``..._weight...``) get the config's init std 0.02; hidden states, norm weights
    and the rotary tables stay at 1."""
    return {n: 0.02 if "weight" in n and len(node.shape) == 2 else 1.0
            for n, node in graph.inputs.items()}


# A quantized weight of std 0.02 over a 4096-wide row: its largest |w| is about 0.08, so a
# per-row scale of about 0.08 / 127 (int8) or 0.08 / 448 (float8 e4m3, whose values then
# have a std of 0.02 / scale, about 112, and stop at 448).
QUANT_DRAWS = {
    "int8": {"_qdata": {"range": [-127, 127]}, "_zero_point": {"range": [0, 0]},
             "_scale": {"uniform": [4e-4, 8e-4]}},
    "float8_e4m3fn": {"_qdata": {"scale": 112.0, "clamp": 448.0},
                      "_scale": {"uniform": [1.4e-4, 2.2e-4]}},
}


def quant_draws(entry: dict) -> None:
    """Give a quantized layer's weight inputs (torchao's ``..._qdata``, ``..._zero_point``,
    ``..._scale``) the draws of ``QUANT_DRAWS`` in ``entry``'s input specs, in place: integer
    values over their range, float8 values clamped to what the format holds, scales
    positive and as large as a real weight's."""
    kind = next((s["dtype"] for n, s in entry["inputs"].items() if n.endswith("_qdata")),
                None)
    for name, spec in entry["inputs"].items():
        for tail, draw in QUANT_DRAWS.get(kind, {}).items():
            if name.endswith(tail):
                spec.update(draw)


def export_layers(folder: Path, seqs, target: str, tune: dict | None = None,
                  quant: str | None = None, timer=None) -> tuple[list[dict], list[dict]]:
    """Each optimized partition of one LLaMA-7B-size LlamaDecoderLayer (bench/real_sizes.py,
    float16, batch 1) at each sequence length in ``seqs``, compiled here through
    ``em.backend`` with its defaults, as one case: ours is the stitched Triton module, the
    reference the partition's ops one torch call each. With ``tune`` (``top`` and
    ``time_limit_s``), each partition's pieces' candidates too (``gpu_tuning``): (cases,
    tuning groups). ``quant``: the linear weights quantized (``real_sizes.layer``), the
    cases' ids and labels naming it. ``timer``: what tunes each piece (``export``)."""
    if not seqs:
        return [], []
    import tempfile

    import torch

    from bench.real_sizes import SEVEN_B, layer

    prof = GPUProfile.load(target)
    entries, groups = [], []
    for seq in seqs:
        fn, args = layer(**SEVEN_B, seq=seq, dtype="float16", quant=quant)
        tag = f"{quant}_" if quant else ""
        torch._dynamo.reset()
        with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
            be = em.backend(target=target, warmup=0, cache=str(Path(tmp) / "c.sqlite"),
                            timer=timer)
            torch.compile(fn, backend=be)(*args)
        for i, e in enumerate(x for x in be.report if x.status == "optimized"):
            scales = layer_scales(e.graph)
            entry = export_case(folder, f"llama7b_{tag}s{seq}_{i}", f"7B layer {tag}"
                                f"s={seq} {e.name}", e.graph, e.result, prof, sdpa=False)
            for n, spec in entry["inputs"].items():
                spec["scale"] = scales[n]
            quant_draws(entry)
            entries.append(entry)
            print(f"  7B layer {tag}s={seq} {e.name}: {len(e.result.program.kernels)} kernels, "
                  f"{e.result.cost_us:.1f} us predicted ({e.seconds:.0f} s)", flush=True)
            for piece in e.result.stats.get("pieces", []):
                if piece.get("tuned") and piece["same_as"] is None:
                    tuned = piece["tuned"]
                    print(f"    piece {piece['index']} tuned: {tuned['chosen']} of "
                          f"{len(tuned['times_us'])} measured", flush=True)
                if piece["status"] != "optimized":
                    print(f"    piece {piece['index']} ({len(piece['ops'])} ops) "
                          f"{piece['status']}: {piece['reason']}", flush=True)
            if tune:
                groups += tuning_groups(folder, entry, e.graph, e.result, target, tune,
                                        scales.__getitem__)
    return entries, groups


def tuned_note(res) -> str:
    """", tuned: <chosen> of N measured" when the search tuned (by ``--measured`` times)."""
    tuned = res.stats.get("tuned")
    if not tuned:
        return ""
    return (f", tuned: {tuned['chosen']} of {len(tuned['times_us'])} measured"
            + (f" ({len(tuned['errors'])} not measured)" if tuned["errors"] else ""))


def tuning_groups(folder: Path, entry: dict, graph, res, target: str, tune: dict,
                  scale_of) -> list[dict]:
    """The tuning groups of one exported case (``gpu_tuning.export_groups``: each piece's
    top verified candidates), with a line saying how many."""
    groups = gpu_tuning.export_groups(folder, entry["id"], entry["case"], graph, res, target,
                                      tune["time_limit_s"], scale_of, tune["top"])
    print(f"    tuning: {len(groups)} piece(s), "
          f"{sum(len(g['candidates']) for g in groups)} candidates", flush=True)
    return groups


# The runner's time outside the tuning groups (seconds): process start, the ceilings and the
# decode family, and per case its checks, torch.compile and the timings (65 s for the 18
# cases and the decode family on the H200, 2026-11-26); a 7B layer's partition compiles longer
MAIN_FIXED_S, MAIN_CASE_S, MAIN_LAYER_S = 30.0, 5.0, 30.0


def plan_device_time(manifest: dict, budget_s: float, reps: int, sets: int) -> dict:
    """Cap the tuning groups' replays (and candidates) so that the runner's estimated time
    stays under ``budget_s`` (``gpu_tuning.fit_budget``); the plan, printed and written
    into the manifest as ``tune``."""
    main = MAIN_FIXED_S + sum(MAIN_LAYER_S if c["id"].startswith("llama7b") else MAIN_CASE_S
                              for c in manifest["cases"])
    groups = manifest["tuning"]
    tune_reps, top, est = gpu_tuning.fit_budget(groups, max(budget_s - main, 0.0), reps, sets)
    plan = {"reps": tune_reps, "sets": sets, "top": top, "groups": len(groups),
            "programs": sum(len(g["candidates"]) + 1 for g in groups),
            "estimate_s": round(est, 1), "main_estimate_s": round(main, 1),
            "budget_s": budget_s}
    print(f"device time, estimated: {main:.0f} s for {len(manifest['cases'])} cases + "
          f"{est:.0f} s tuning ({plan['groups']} groups, {plan['programs']} programs, "
          f"{tune_reps} replays x {sets} sets, top {top}) = {main + est:.0f} s "
          f"(budget {budget_s:.0f} s)", flush=True)
    return plan


def export(folder: Path, selected, target: str, time_limit_s: float,
           decode: bool = True, dtypes: tuple[str, ...] = ("float16",),
           layer_seqs=(), top: int = gpu_tuning.TOP, budget_s: float = 420.0,
           tune_reps: int = 100, sets: int = 4, quant_layers=(), timer=None) -> dict:
    """Optimize and write every selected (name, batch) case in each of ``dtypes`` (cases
    in a dtype other than float16 get it in their id and label), and the 7B-size layer at
    each of ``layer_seqs`` (``export_layers``); with ``top`` > 0, each case's pieces' top
    verified candidates as tuning groups, their replays capped so that the runner's
    estimated time stays under ``budget_s`` (``plan_device_time``); ``quant_layers``:
    (quantization, sequence length) pairs of the 7B-size layer with quantized weights, as
    cases without tuning groups; ``timer`` (a ``RecordedTimer``: ``--measured``) tunes every
    search by times measured on a GPU before; returns the manifest."""
    folder.mkdir(parents=True, exist_ok=True)
    prof = GPUProfile.load(target)
    tune = {"top": top, "time_limit_s": time_limit_s} if top > 0 else None
    entries, groups = [], []
    for dt in dtypes:
        tag = "" if dt == "float16" else f"_{dt}"
        for name, batch in selected:
            with programs.dtype(dt):
                graph = program(name, batch)
            res = em.optimize(graph, target=target, time_limit_s=time_limit_s, timer=timer)
            label = f"{name} b={batch}" + (f" {dt}" if tag else "")
            if res.verified is None or not res.verified.equivalent:
                print(f"  {label}: no verified program ({res.stats.get('note', '')}); "
                      "its input is exported", flush=True)
            scale = REALISTIC.get(name, 0.1)
            entries.append(export_case(folder, f"{name}_b{batch}{tag}", label, graph, res,
                                       prof, scale, name != "causal"))
            print(f"  {label}: {len(res.program.kernels)} kernels, "
                  f"{res.cost_us:.2f} us predicted" + tuned_note(res), flush=True)
            if tune:
                groups += tuning_groups(folder, entries[-1], graph, res, target, tune,
                                        lambda _, s=scale: s)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        commit = ""
    layer_cases, layer_groups = export_layers(folder, layer_seqs, target, tune, timer=timer)
    entries, groups = entries + layer_cases, groups + layer_groups
    for quant, seq in quant_layers:
        entries += export_layers(folder, [seq], target, None, quant, timer)[0]
    families = [export_family(folder, target, time_limit_s)] if decode else []
    manifest = {"made": {"commit": commit, "target": target, "version": em.__version__},
                "cases": entries, "families": families, "tuning": groups}
    manifest["tune"] = plan_device_time(manifest, budget_s, tune_reps, sets)
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    shutil.copy(RUNNER, folder / "gpu_runner.py")
    return manifest


def rows_from(manifest: dict, results: dict, bandwidth_GBps: float) -> list[dict]:  # noqa: N803
    """The runner's results joined with the manifest, as ``gpu_bench`` table rows."""
    by_case = {c["case"]: c for c in manifest["cases"]}
    rows = []
    for r in results["cases"]:
        c = by_case[r["case"]]
        if "error" in r:  # the case raised on the device: listed as failed, not timed
            nan = float("nan")
            rows.append({"case": r["case"], "eager": nan, "compile": nan, "sdpa": None,
                         "ours": nan, "predicted": c["predicted_us"], "dram_frac": None,
                         "rel_err": nan, "ok": False, "error": r["error"]})
            continue
        if "ours_us" not in r:
            raise em.MirageError(f"{r['case']}: no timings in the results (a --device cpu run?)")
        frac = (c["min_bytes"] / (r["ours_us"] * 1e-6) / (bandwidth_GBps * 1e9)
                if c["memory_bound"] else None)
        rows.append({"case": r["case"], "eager": r.get("eager_us", float("nan")),
                     "compile": r.get("compile_us", float("nan")),
                     "sdpa": r.get("sdpa_us"), "ours": r["ours_us"],
                     "predicted": c["predicted_us"], "dram_frac": frac,
                     "rel_err": r["rel_err"], "ok": r["ok"]})
    return rows


def measured_programs(manifest: dict, results: dict) -> list:
    """Every correct, timed case of a bundle (or a schedule sweep) as a ``Measured``
    program with its MuGraph, for ``calibrate.fit_figures``."""
    from eqsat_mirage.cost.calibrate import Measured
    from eqsat_mirage.mugraph.program import MuGraph

    by_case = {c["case"]: c for c in manifest["cases"]}
    out = []
    for r in results["cases"]:
        c = by_case[r["case"]]
        if c.get("mugraph") is None or not r.get("ok") or "ours_us" not in r:
            continue
        out.append(Measured(r["case"], MuGraph.from_json(json.dumps(c["mugraph"])),
                            r["ours_us"], r.get("ours_plain_us")))
    return out


def fit_calibration(bundles: list[tuple[dict, dict]], target: str, device: str, path: Path):
    """Fit the profile's figures to every measured program of ``bundles`` (the benchmark
    bundle and any schedule sweeps: (manifest, results) pairs) and write ``path``."""
    from eqsat_mirage.cost.calibrate import fit_figures, write_fitted

    programs = [p for m, r in bundles for p in measured_programs(m, r)]
    programs += [p for m, r in bundles for p in gpu_tuning.measured_programs(m, r)]
    fitted = fit_figures(programs, target)
    write_fitted(path, fitted, device)
    return fitted


def calibration(manifest: dict, results: dict, prof, device: str, path: Path):
    """Fit the cost model to the measured CUDA-graph and plain times
    (``cost.calibrate``) and write ``path`` (kept in bench/: the H200's default figures,
    ``extract/h200_measured.toml``, are the ranking fit, ``sweep_programs.py --enable``)."""
    from eqsat_mirage.cost.calibrate import Sample, fit, write_measured
    from eqsat_mirage.cost.gpucost import mugraph_cost

    samples = [Sample(m.case, mugraph_cost(m.mugraph, prof), m.graph_us, m.plain_us)
               for m in measured_programs(manifest, results)]
    fitted = fit(samples, prof)
    write_measured(path, fitted, device)
    return fitted


def family_lines(results: dict) -> list[str]:
    """One line per family the runner ran: correctness and the median time per step."""
    nan = float("nan")
    return [f"{f['case']}: {'ok' if f['ok'] else 'FAILED'}, max rel. error "
            f"{f['rel_err']:.1e}; median per step (plain launches) ours "
            f"{f.get('ours_us', nan):.1f} us, eager {f.get('eager_us', nan):.1f} us, "
            f"SDPA {f.get('sdpa_us', nan):.1f} us" for f in results.get("families", [])]


# torchao's weight-only layers (``hf_models.quantized``) whose inputs ``quant_draws`` knows
QUANT_LAYERS = ("int8", "fp8", "int4g128")


def quant_layer(text: str) -> tuple[str, int]:
    """``--quant-layer``'s QUANT:SEQ as (quantization, sequence length)."""
    quant, _, seq = text.partition(":")
    if quant not in QUANT_LAYERS or not seq.isdigit():
        raise argparse.ArgumentTypeError(f"--quant-layer {text!r}: QUANT:SEQ, QUANT one of "
                                         + ", ".join(QUANT_LAYERS))
    return quant, int(seq)


def main(argv: list[str] | None = None) -> int:
    """``export`` or ``ingest`` (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export")
    ex.add_argument("folder", type=Path)
    ex.add_argument("--bench", action="append")
    ex.add_argument("--batch", type=int, action="append")
    ex.add_argument("--target", default="h100")
    ex.add_argument("--time-limit", type=float, default=120.0)
    ex.add_argument("--dtype", action="append",
                    help="input dtype of the cases (repeatable; float16 by default)")
    ex.add_argument("--no-decode", action="store_true",
                    help="leave out the decode family (64 steps of a growing KV cache)")
    ex.add_argument("--layer-seq", type=int, action="append", default=[],
                    help="also a LLaMA-7B-size layer at this sequence length (repeatable; "
                         "minutes each here, defaults of em.backend)")
    ex.add_argument("--quant-layer", action="append", default=[], metavar="QUANT:SEQ",
                    help="also the 7B-size layer with quantized weights (QUANT one of "
                         f"{', '.join(QUANT_LAYERS)}) at this sequence length, without tuning "
                         "groups (repeatable)")
    ex.add_argument("--top", type=int, default=gpu_tuning.TOP,
                    help="verified candidates per piece the runner times (0: none)")
    ex.add_argument("--budget-s", type=float, default=420.0,
                    help="the runner's whole run on the GPU, estimated, stays under this")
    ex.add_argument("--tune-reps", type=int, default=100,
                    help="CUDA-graph replays per candidate, at most (capped to the budget)")
    ex.add_argument("--sets", type=int, default=4, help="input sets the runner draws")
    ex.add_argument("--measured", type=Path,
                    help="times measured on a GPU before (ingest --measured): each piece's "
                         "plan is the fastest measured of its verified plans and eager form")
    ing = sub.add_parser("ingest")
    ing.add_argument("folder", type=Path)
    ing.add_argument("results", type=Path)
    ing.add_argument("--write", type=Path)
    ing.add_argument("--calibration", type=Path)
    ing.add_argument("--sweep", nargs=2, type=Path, action="append", metavar=("FOLDER", "JSON"),
                     help="a schedule sweep's bundle and results (bench/schedule_sweep.py): "
                          "its variants join the calibration, whose figures are then fitted "
                          "by re-pricing every program (calibrate.fit_figures)")
    ing.add_argument("--records", type=Path,
                     help="write every measured tuning candidate (MuGraph, measured and "
                          "predicted time) as JSON here (bench/gpu_<gpu>_<date>_tuning.json)")
    ing.add_argument("--measured", type=Path,
                     help="write the tuning groups' measured times, keyed by plan, for "
                          "export --measured (bench/gpu_<gpu>_<date>_measured.json)")
    args = ap.parse_args(argv)
    if args.cmd == "export":
        every = list(cases()) + [(n, b) for n in SAFE for b in BATCHES]
        selected = [(n, b) for n, b in every if (not args.bench or n in args.bench)
                    and (not args.batch or b in args.batch)]
        manifest = export(args.folder, selected, args.target, args.time_limit,
                          not args.no_decode, tuple(args.dtype or ("float16",)),
                          args.layer_seq, args.top, args.budget_s, args.tune_reps, args.sets,
                          [quant_layer(q) for q in args.quant_layer],
                          RecordedTimer.load(args.measured) if args.measured else None)
        print(f"wrote {len(manifest['cases'])} cases and {len(manifest['tuning'])} tuning "
              f"groups to {args.folder}")
        return 0
    return ingest(args)


def ingest(args) -> int:
    """``ingest`` (see the module docstring): the GPU timings and tuned-choice sections,
    the measurement records and the calibration; 1 when a case or a candidate was wrong."""
    manifest = json.loads((args.folder / "manifest.json").read_text())
    results = json.loads(args.results.read_text())
    prof = GPUProfile.load(manifest["made"]["target"])
    timed = results["device"] != "cpu"  # a --device cpu run has the checks, no timings
    rows = rows_from(manifest, results, prof.dram_bandwidth_GBps) if timed else []
    bad = [r["case"] for r in rows if not r["ok"] or not math.isfinite(r["ours"])]
    bad += [r["case"] for r in results["cases"] if not timed and not r.get("ok")]
    tuned = gpu_tuning.tuned_rows(manifest, results)
    bad += [f"{r['case']} piece {r['piece']} {w}" for r in tuned for w in r["wrong"]]
    if bad:
        print(f"failed the correctness check: {bad}", file=sys.stderr)
    device = f"{results['device']} (torch {results['torch']}, triton {results['triton']})"
    if args.write and rows:
        text = section(rows, device, "bench/gpu_bundle.py export + gpu_runner.py (CUDA-graph "
                       "replays) + ingest", 200)
        fams = family_lines(results)
        write_section(args.write, text.rstrip("\n") + ("\n\n" + "\n".join(fams) + "\n"
                                                       if fams else "\n"))
    if args.write and tuned:
        replace_section(args.write, gpu_tuning.SECTION, gpu_tuning.tuned_section(tuned, device))
    if args.measured:
        timer = gpu_tuning.recorded_timer(manifest, results)
        args.measured.write_text(timer.to_json(), encoding="utf-8")
        print(f"measured: {len(timer.times_us)} plans' times written to {args.measured}")
    if args.records:
        n = gpu_tuning.write_records(args.records, manifest, results)
        print(f"records: {n} measured programs written to {args.records}")
    if results.get("tuning"):
        spent = sum(r.get("seconds", 0.0) for r in results["tuning"])
        print(f"tuning groups: {len(results['tuning'])} ran in {spent:.0f} s, estimated "
              f"{(manifest.get('tune') or {}).get('estimate_s', float('nan'))} s at export")
    for r in tuned:
        print(f"{r['case']} piece {r['piece']}: model's choice {r['model']} "
              f"{r['model_us']:.2f} us, tuned {r['tuned']} {r['tuned_us']:.2f} us, eager "
              f"{r['eager_us']:.2f} us")
    if args.calibration and (args.sweep or tuned):  # many programs: fit the figures
        sweeps = [(json.loads((folder / "manifest.json").read_text()),
                   json.loads(res.read_text())) for folder, res in args.sweep or []]
        fitted = fit_calibration([(manifest, results), *sweeps], manifest["made"]["target"],
                                 device, args.calibration)
        print(f"calibration: {len(fitted.cases)} programs, rms relative error "
              f"{fitted.residual_before:.1%} with the datasheet figures, {fitted.residual:.1%} "
              f"fitted; {fitted.figures}")
    elif args.calibration:
        fitted = calibration(manifest, results, prof, device, args.calibration)
        print(f"calibration: {fitted.residual:.1%} rms error of the fit; {fitted.figures}")
    for r in rows:
        print(f"{r['case']}: ours {r['ours']:.1f} us, predicted {r['predicted']:.1f} us, "
              f"eager {r['eager']:.1f}, compile {r['compile']:.1f}")
    for line in family_lines(results):
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
