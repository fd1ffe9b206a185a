"""The GPU bundle's tuning part: each piece's verified candidates, exported, timed, read back.

``export_groups`` (called by ``gpu_bundle.py export`` per case) searches each piece of a case
(the case itself when it is one piece; each optimized piece of a whole program, the 7B layer's
included) with a search that keeps up to ``top`` verified plans, cheapest by the cost model
first, instead of timing them here (``KeepingSearch``); each plan's Triton module and the
piece's eager module (one torch call per op) go into the bundle as one tuning *group*. The
model's choice is a group's first candidate. ``fit_budget`` caps the runner's replays per
program (and, if that is not enough, the candidates per group) so that the estimated device
time of the groups stays under a budget (``estimate_s``: compile time per kernel, a bound per
replay from the predicted time).

The runner (``gpu_runner.py``, section "tuning") checks each candidate's first launch against
float64 beside the eager module, times every candidate and the eager form as CUDA-graph
replays (median), and writes one row per group. ``tuned_rows`` / ``tuned_section`` read the
rows back as the "## Tuned choices" table (the model's choice beside the measured fastest),
``measured_programs`` as ``cost.calibrate.Measured`` programs (so a fit uses them),
``write_records`` as a JSON file of every measured program with its MuGraph, and
``recorded_timer`` as the measured times a later export tunes with (``--measured``: the
search here chooses each piece's plan by the GPU's times, as ``tune="auto"`` does on a GPU).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from eqsat_mirage.codegen.source import triton_source
from eqsat_mirage.cost.gpucost import mugraph_cost
from eqsat_mirage.cost.profile import GPUProfile
from eqsat_mirage.ir.errors import MirageError
from eqsat_mirage.mugraph.program import MuGraph, from_graph
from eqsat_mirage.pipeline.options import split_options
from eqsat_mirage.pipeline.search import Search
from eqsat_mirage.runtime.timing import RecordedTimer, identity, plan_key

TOP = 8  # candidates per group
SECTION = "## Tuned choices"
# the estimate's figures (seconds): Triton's compile of one kernel on the GPU machine, the
# fixed work per program (load, the float64 check, the capture), a floor per replay (the
# event pair and the host's synchronize) and the slack over the predicted time (the model
# was measured up to 3x off). The first GPU run of the groups (H200, 2026-12-04: 18 groups,
# 157 programs, 50 replays x 4 sets) took 148 s where 0.8 and 0.3 estimated 228 s
COMPILE_S, PROGRAM_S, REPLAY_FLOOR_US, SLACK = 0.5, 0.2, 25.0, 4.0
WARM_CALLS = 5  # per input set: 3 warm-ups, the capture, the checked launch
MIN_REPS = 20


class _Keeper:
    """The timer a ``KeepingSearch`` is given: its presence makes the search verify up to
    ``tune_candidates`` plans; it is never called."""

    device = "bundle"

    def __call__(self, name, launch):
        """Never timed here: the GPU machine times the candidates."""
        raise MirageError("the bundle's search times nothing; the runner times on the GPU")


class KeepingSearch(Search):
    """A ``Search`` that keeps its verified plans (``kept``: (stats entry, plan), cheapest by
    the model first) and chooses the model's pick, timing nothing."""

    def __init__(self, graph, target: str, time_limit_s: float, top: int = TOP) -> None:
        options = split_options({"target": target, "time_limit_s": time_limit_s,
                                 "tune": "device", "tune_candidates": top})[0]
        super().__init__(graph, options, None, _Keeper())
        self.kept: list[tuple] = []

    def tune_verified(self, verified: list[tuple], eager) -> tuple:
        """The verified plans kept; the model's pick (the first) chosen."""
        self.kept = [(entry, plan) for plan, _, entry in verified]
        return verified[0][:2]


def pieces_of(graph, res) -> list[tuple[object, dict[str, str]]]:
    """What a case's tuning groups search: (piece graph, its input names -> the case's
    input names where it reads one) for each distinct optimized piece of a whole program
    (``res.pieces``), else the case itself."""
    if not getattr(res, "pieces", None):
        return [(graph, {n: n for n in graph.inputs})]
    names = {id(node): name for name, node in graph.inputs.items()}
    out, seen = [], set()
    for piece, optimized in res.pieces:
        text = triton_source(from_graph(piece.graph))
        if not optimized or text in seen:
            continue
        seen.add(text)
        out.append((piece.graph, {n: names[id(node)] for n, node in piece.inputs.items()
                                  if id(node) in names}))
    return out


def export_groups(folder: Path, case_id: str, label: str, graph, res, target: str,
                  time_limit_s: float, scale_of, top: int = TOP) -> list[dict]:
    """Each piece of one case searched for up to ``top`` verified candidates and written
    into ``folder`` (candidate modules and the piece's eager module); the groups' manifest
    entries (``scale_of``: a case input's name -> its scale; inputs between pieces get 1)."""
    prof = GPUProfile.load(target)
    groups = []
    for j, (g, names) in enumerate(pieces_of(graph, res)):
        search = KeepingSearch(g, target, time_limit_s, top)
        search.run()
        if not search.kept:
            continue
        gid = f"{case_id}_p{j}"
        eager = from_graph(g)
        (folder / f"{gid}_ref.py").write_text(
            triton_source(eager, header=f"# {label} piece {j}: one torch call per op"),
            encoding="utf-8")
        cands = []
        for i, (entry, plan) in enumerate(search.kept):
            module = f"{gid}_c{i}.py"
            (folder / module).write_text(triton_source(plan.mugraph), encoding="utf-8")
            cands.append({"name": f"#{i}", "how": entry["how"], "module": module,
                          "predicted_us": mugraph_cost(plan.mugraph, prof).total_us,
                          "kernels": len(plan.mugraph.kernels),
                          "compiled": sum(k.kind == "custom" for k in plan.mugraph.kernels),
                          "mugraph": json.loads(plan.mugraph.to_json())})
        groups.append({
            "id": gid, "case": label, "piece": j, "ref": f"{gid}_ref.py",
            "inputs": {n: {"shape": list(node.shape), "dtype": node.dtype,
                           "scale": scale_of(names[n]) if n in names else 1.0}
                       for n, node in g.inputs.items()},
            "eager_predicted_us": mugraph_cost(eager, prof).total_us,
            "eager_mugraph": json.loads(eager.to_json()), "candidates": cands})
    return groups


def program_s(predicted_us: float, compiled: int, reps: int, sets: int) -> float:
    """The device-time bound of one program in the runner: its Triton kernels' compile
    (``compiled`` of them), the fixed work, and ``sets`` x warm calls plus ``reps`` replays
    at the bound per call."""
    per_call = max(SLACK * predicted_us, 0.0) + REPLAY_FLOOR_US
    return compiled * COMPILE_S + PROGRAM_S + (sets * WARM_CALLS + reps) * per_call * 1e-6


def estimate_s(groups: list[dict], reps: int, sets: int) -> float:
    """The device-time bound of every group: each candidate and the eager form (torch's
    own kernels: nothing to compile)."""
    total = 0.0
    for g in groups:
        total += program_s(g["eager_predicted_us"], 0, reps, sets)
        total += sum(program_s(c["predicted_us"], c["compiled"], reps, sets)
                     for c in g["candidates"])
    return total


def fit_budget(groups: list[dict], budget_s: float, reps: int, sets: int
               ) -> tuple[int, int, float]:
    """(replays, candidates per group, estimated seconds) that keep ``estimate_s`` under
    ``budget_s``: the replays first, down to ``MIN_REPS``; then the candidates per group,
    the model's costliest dropped first (``groups`` are cut in place)."""
    while reps > MIN_REPS and estimate_s(groups, reps, sets) > budget_s:
        reps = max(MIN_REPS, int(reps * 0.8))
    top = max((len(g["candidates"]) for g in groups), default=0)
    while top > 1 and estimate_s(groups, reps, sets) > budget_s:
        top -= 1
        for g in groups:
            del g["candidates"][top:]
    return reps, top, estimate_s(groups, reps, sets)


# -- reading the runner's rows back ---------------------------------------------------------

def tuned_rows(manifest: dict, results: dict) -> list[dict]:
    """One row per timed group: the model's choice (its first candidate) and the measured
    fastest of the correct candidates and the eager form."""
    groups = {g["id"]: g for g in manifest.get("tuning", [])}
    rows = []
    for r in results.get("tuning", []):
        g = groups.get(r.get("id"))
        times = {c["name"]: c["us"] for c in r.get("candidates", [])
                 if c.get("ok") and isinstance(c.get("us"), (int, float))}
        if g is None or not times:
            continue
        if isinstance(r.get("eager_us"), (int, float)):
            times["eager"] = r["eager_us"]
        model = g["candidates"][0]["name"]
        tuned = min(times, key=lambda n: (times[n], n != model))
        rows.append({"id": r["id"], "case": g["case"], "piece": g["piece"],
                     "candidates": len(r["candidates"]), "model": model,
                     "model_us": times.get(model, math.nan), "tuned": tuned,
                     "tuned_us": times[tuned], "eager_us": times.get("eager", math.nan),
                     "wrong": [c["name"] for c in r["candidates"] if c.get("ok") is False]})
    return rows


def tuned_section(rows: list[dict], device: str) -> str:
    """The "## Tuned choices" section: per group, the model's choice and the measured
    fastest, with the speed-up of tuning over the model's choice."""
    how = ("made-up times (--stub-times: a test, not a measurement)"
           if device.startswith("cpu") else "CUDA-graph replays, median")
    lines = [SECTION, "", f"Device: {device}. Each piece's verified candidates (the model's "
             f"choice is #0) and its eager form, {how} (bench/gpu_bundle.py export + "
             "gpu_runner.py + ingest).", "",
             "| case | piece | candidates | model's choice (us) | tuned choice (us) | eager (us) "
             "| gain (model / tuned) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        gain = r["model_us"] / r["tuned_us"] if r["tuned_us"] > 0 else math.nan
        lines.append(f"| {r['case']} | {r['piece']} | {r['candidates']} | {r['model']} "
                     f"{r['model_us']:.2f} | {r['tuned']} {r['tuned_us']:.2f} | "
                     f"{r['eager_us']:.2f} | {gain:.2f}x |")
    return "\n".join(lines) + "\n"


def measured(manifest: dict, results: dict) -> list[dict]:
    """Every correct, timed program of the tuning groups (candidates and eager forms):
    label, MuGraph (as JSON data), measured and predicted microseconds."""
    groups = {g["id"]: g for g in manifest.get("tuning", [])}
    out = []
    for r in results.get("tuning", []):
        g = groups.get(r.get("id"))
        if g is None:
            continue
        by_name = {c["name"]: c for c in g["candidates"]}
        for c in r.get("candidates", []):
            if c.get("ok") and isinstance(c.get("us"), (int, float)) and c["name"] in by_name:
                spec = by_name[c["name"]]
                out.append({"case": f"{g['case']} piece {g['piece']} {c['name']}",
                            "mugraph": spec["mugraph"], "measured_us": c["us"],
                            "predicted_us": spec["predicted_us"], "how": spec["how"]})
        if isinstance(r.get("eager_us"), (int, float)) and g.get("eager_mugraph"):
            out.append({"case": f"{g['case']} piece {g['piece']} eager",
                        "mugraph": g["eager_mugraph"], "measured_us": r["eager_us"],
                        "predicted_us": g["eager_predicted_us"], "how": "eager"})
    return out


def measured_programs(manifest: dict, results: dict) -> list:
    """``measured`` as ``cost.calibrate.Measured`` programs (CUDA-graph times), which
    ``calibrate.fit_figures`` fits from."""
    from eqsat_mirage.cost.calibrate import Measured

    return [Measured(m["case"], MuGraph.from_json(json.dumps(m["mugraph"])), m["measured_us"])
            for m in measured(manifest, results)]


def recorded_timer(manifest: dict, results: dict) -> RecordedTimer:
    """Every correct, timed program of the tuning groups (``measured``) as a
    ``RecordedTimer``: its ``plan_key`` -> its measured median, on the device and versions
    the runner names (the first measurement of a plan timed twice). Written by ``ingest
    --measured``, read by ``export --measured`` so that the search here chooses each piece's
    plan by the GPU's times."""
    device = identity(results["device"], results.get("torch"), results.get("triton"),
                      results.get("cuda") or "unknown")
    times: dict[str, float] = {}
    for m in measured(manifest, results):
        times.setdefault(plan_key(m["mugraph"]), float(m["measured_us"]))
    return RecordedTimer(device, times)


def write_records(path: Path, manifest: dict, results: dict) -> int:
    """Write ``measured`` with the device and the target priced for (one JSON file, to
    commit beside the runner's results); the number of programs."""
    made = manifest.get("made") or {}
    records = measured(manifest, results)
    path.write_text(json.dumps({"device": results.get("device"), "torch": results.get("torch"),
                                "triton": results.get("triton"), "target": made.get("target"),
                                "commit": made.get("commit"), "programs": records},
                               separators=(",", ":")), encoding="utf-8")
    return len(records)
