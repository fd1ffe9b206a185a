"""The GPU protocol's bundle: exported here, run by the standalone runner (CPU part in CI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import eqsat_mirage as em
from bench.gpu_bundle import export_case, rows_from
from eqsat_mirage.cost.profile import GPUProfile

ROOT = Path(__file__).resolve().parent.parent


def small() -> em.Graph:
    g = em.Graph("rmslin")
    x = g.input("X", (4, 64), dtype="float16")
    w = g.input("W", (64, 32), dtype="float16")
    g.output(em.rms_norm(x) @ w, "Y")
    return g


def bundle(tmp_path: Path) -> Path:
    g = small()
    res = em.optimize(g, cache=False)
    entry = export_case(tmp_path, "rmslin", "rmslin b=1", g, res, GPUProfile.load("h100"),
                        scale=1.0)
    (tmp_path / "manifest.json").write_text(json.dumps({"made": {"target": "h100"},
                                                        "cases": [entry]}))
    return tmp_path


def run_runner(folder: Path) -> tuple[int, dict, str]:
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = folder / "out.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_runner.py"), str(folder),
                        "--out", str(out), "--device", "cpu", "--sets", "2"],
                       capture_output=True, text=True, env=env, timeout=300)
    return p.returncode, json.loads(out.read_text()), p.stdout + p.stderr


def test_the_runner_checks_the_exported_program_against_float64(tmp_path):
    folder = bundle(tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    case = manifest["cases"][0]
    assert case["inputs"]["X"] == {"shape": [4, 64], "dtype": "float16", "scale": 1.0}
    assert case["predicted_us"] > 0 and case["min_bytes"] == (4 * 64 + 64 * 32 + 4 * 32) * 2
    ours = (folder / case["ours"]).read_text()
    assert "import eqsat_mirage" not in ours and "import eqsat_mirage" not in \
        (folder / case["ref"]).read_text()  # the GPU machine has torch and triton only
    rc, results, log = run_runner(folder)
    assert rc == 0, log
    row = results["cases"][0]
    assert row["ok"] and row["nonfinite"] == 0 and 0 < row["rel_err"] < 2e-3


def run_edited(tmp_path, old: str, new: str, needs: str):
    """The runner over a bundle whose first case's module has ``old`` replaced by ``new``
    (the module must hold ``needs``)."""
    folder = bundle(tmp_path)
    case = json.loads((folder / "manifest.json").read_text())["cases"][0]
    path = folder / case["ours"]
    text = path.read_text()
    assert old in text and needs in text
    path.write_text(text.replace(old, new))
    return run_runner(folder)


def test_the_runner_fails_a_wrong_program(tmp_path):
    rc, results, log = run_edited(tmp_path, 'return {"Y": Y}', 'return {"Y": Y * 1.01}',
                                  'return {"Y": Y}')
    assert rc == 1 and not results["cases"][0]["ok"], log
    assert results["cases"][0]["rel_err"] > 5e-3


def test_the_runner_poisons_what_the_module_allocates(tmp_path):
    """An output no kernel writes (here a fresh ``new_empty``, the launcher's allocation)
    reads as NaN in the checked runs."""
    rc, results, log = run_edited(tmp_path, 'return {"Y": Y}',
                                  'return {"Y": Y.new_empty(Y.shape)}', ".new_empty(")
    assert rc == 1 and results["cases"][0]["nonfinite"] > 0, log


def test_ingest_turns_timings_into_rows():
    manifest = {"cases": [{"case": "x b=1", "predicted_us": 10.0, "min_bytes": 3e6,
                           "memory_bound": True}]}
    results = {"cases": [{"case": "x b=1", "eager_us": 30.0, "compile_us": 20.0,
                          "ours_us": 5.0, "rel_err": 1e-4, "ok": True}]}
    (row,) = rows_from(manifest, results, 3000.0)
    assert row["ours"] == 5.0 and row["sdpa"] is None
    assert abs(row["dram_frac"] - 3e6 / 5e-6 / 3e12) < 1e-12


def test_the_decode_family_runs_step_by_step_through_its_one_module(tmp_path):
    """The bundle's decode family: one module whose launcher serves every L (steps across a
    padded size's boundary included), K and V cut to L (views), checked against float64 by
    the runner."""
    from bench.gpu_bundle import export_family

    entry = export_family(tmp_path, "h100", 60.0, first=126, steps=6)
    assert entry["modules"] == {"0": "decode_family.py"} and entry["short"] == ["K", "V"]
    assert len({-(-n // entry["granule"]) for n in range(126, 132)}) >= 2  # crosses a granule
    text = (tmp_path / "decode_family.py").read_text()
    assert "import eqsat_mirage" not in text and "PADDED = None" in text
    (tmp_path / "manifest.json").write_text(json.dumps({"made": {"target": "h100"},
                                                        "cases": [], "families": [entry]}))
    rc, results, log = run_runner(tmp_path)
    assert rc == 0, log
    (row,) = results["families"]
    assert row["ok"] and row["nonfinite"] == 0 and row["rel_err"] < 1e-2, row


def tuning_bundle(tmp_path: Path) -> tuple[Path, dict]:
    """A bundle of one case whose three pieces (``small`` cut at three ops) are tuning
    groups, as a whole program's are (``res.pieces``)."""
    from types import SimpleNamespace

    from bench.gpu_bundle import plan_device_time, tuning_groups
    from eqsat_mirage.partition.pieces import partition

    g = small()
    res = em.optimize(g, cache=False)
    entry = export_case(tmp_path, "rmslin", "rmslin b=1", g, res, GPUProfile.load("h100"),
                        scale=1.0)
    whole = SimpleNamespace(pieces=[(p, True) for p in partition(g, 3)])
    groups = tuning_groups(tmp_path, entry, g, whole, "h100", {"top": 8, "time_limit_s": 30},
                           lambda name: 1.0)
    manifest = {"made": {"target": "h100"}, "cases": [entry], "tuning": groups}
    manifest["tune"] = plan_device_time(manifest, 420.0, 100, 2)
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return tmp_path, manifest


def test_the_bundle_tunes_each_piece_and_ingest_reads_the_times_back(tmp_path, monkeypatch):
    """Each piece's verified candidates (the model's choice first) and its eager form are
    exported, checked by the runner (CPU, interpreter) and given made-up times; ingest writes
    the tuned-choice table and the measurement records a calibration fits from."""
    from bench import gpu_tuning
    from bench.gpu_bundle import main
    from eqsat_mirage.cost.gpucost import mugraph_cost

    monkeypatch.setenv("EQSAT_MIRAGE_COMPILE_CHECK", "0")  # the plans, built faster
    folder, manifest = tuning_bundle(tmp_path)
    groups = manifest["tuning"]
    assert len(groups) >= 2 and all(g["candidates"] for g in groups)
    for g in groups:
        assert g["candidates"][0]["name"] == "#0" and len(g["candidates"]) <= 8
        for c in g["candidates"]:
            assert "import eqsat_mirage" not in (folder / c["module"]).read_text()
    plan = manifest["tune"]
    assert plan["reps"] == 100 and plan["estimate_s"] + plan["main_estimate_s"] <= 420.0
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = folder / "out.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_runner.py"), str(folder),
                        "--out", str(out), "--device", "cpu", "--sets", "1", "--stub-times"],
                       capture_output=True, text=True, env=env, timeout=300)
    results = json.loads(out.read_text())
    assert p.returncode == 0, p.stdout + p.stderr
    assert [r["id"] for r in results["tuning"]] == [g["id"] for g in groups]
    for r in results["tuning"]:
        assert r["ok"] and all(c["ok"] and c["rel_err"] < 2e-3 for c in r["candidates"])
        stub = {c["name"]: c["us"] for c in r["candidates"]} | {"eager": r["eager_us"]}
        assert r["tuned"] == min(stub, key=stub.get)
    md, rec = tmp_path / "RESULTS.md", tmp_path / "records.json"
    assert main(["ingest", str(folder), str(out), "--write", str(md), "--records",
                 str(rec)]) == 0
    text = md.read_text()
    assert gpu_tuning.SECTION in text and "## GPU timings" not in text  # no CPU timings
    table = [line for line in text.splitlines() if line.startswith("| rmslin b=1 |")]
    assert len(table) == len(groups)
    rows = gpu_tuning.tuned_rows(manifest, results)
    assert [r["tuned"] for r in rows] == [r["tuned"] for r in results["tuning"]]
    assert all(r["model"] == "#0" and r["tuned_us"] <= r["model_us"] for r in rows)
    records = json.loads(rec.read_text())
    assert records["target"] == "h100" and records["device"] == "cpu"
    timed = sum(len(r["candidates"]) + 1 for r in results["tuning"])
    assert len(records["programs"]) == timed
    measured = gpu_tuning.measured_programs(manifest, results)
    assert len(measured) == timed
    prof = GPUProfile.load("h100")
    for m in measured:  # each record re-prices: what calibrate.fit_figures does
        assert m.graph_us > 0 and mugraph_cost(m.mugraph, prof).total_us > 0


def test_the_device_time_estimate_caps_replays_then_candidates():
    """The export's estimate of the runner's tuning time (compile per kernel, a bound per
    replay) stays under the budget: replays capped first, then candidates per group."""
    from bench import gpu_tuning

    def groups(n):  # slow programs: their replays are most of the estimate
        return [{"eager_predicted_us": 2000.0, "candidates": [
            {"predicted_us": 2000.0, "compiled": 1} for _ in range(8)]} for _ in range(n)]

    roomy = groups(2)
    assert gpu_tuning.fit_budget(roomy, 1e4, 200, 4)[:2] == (200, 8)
    tight = groups(20)
    full = gpu_tuning.estimate_s(tight, 200, 4)
    reps, top, est = gpu_tuning.fit_budget(tight, full / 2, 200, 4)
    assert reps < 200 and top == 8 and est <= full / 2
    tiny = groups(20)
    reps, top, est = gpu_tuning.fit_budget(tiny, 60.0, 200, 4)
    assert reps == gpu_tuning.MIN_REPS and top < 8 and est <= 60.0
    assert all(len(g["candidates"]) == top for g in tiny)


def test_quantized_weights_are_drawn_as_stored_and_checked(tmp_path):
    """A torchao-style int8 weight (``..._qdata``, ``..._zero_point``, ``..._scale``) gets
    the draws of ``quant_draws``: integers over [-127, 127], zero points 0 and positive
    scales; the runner checks the dequantizing program against float64 on them."""
    from bench.gpu_bundle import quant_draws
    from bench.gpu_runner import draw

    g = em.Graph("w8")
    x = g.input("X", (4, 64), dtype="float16")
    q = g.input("w_qdata", (32, 64), dtype="int8")
    z = g.input("w_zero_point", (32, 1), dtype="int8")
    s = g.input("w_scale", (32, 1), dtype="float32")
    w = ((q.astype("float32") - z.astype("float32")) * s).astype("float16")
    g.output(x @ w.T, "Y")
    res = em.optimize(g, cache=False)
    entry = export_case(tmp_path, "w8", "w8 b=1", g, res, GPUProfile.load("h100"), scale=1.0)
    quant_draws(entry)
    spec = entry["inputs"]
    assert spec["w_qdata"]["range"] == [-127, 127] and spec["w_zero_point"]["range"] == [0, 0]
    lo, hi = spec["w_scale"]["uniform"]
    assert 0 < lo < hi
    drawn = draw(entry, "cpu", 0)
    assert str(drawn["w_qdata"].dtype) == "torch.int8" and drawn["w_qdata"].abs().max() <= 127
    assert drawn["w_qdata"].unique().numel() > 100 and not drawn["w_zero_point"].any()
    assert ((drawn["w_scale"] >= lo) & (drawn["w_scale"] <= hi)).all()
    (tmp_path / "manifest.json").write_text(json.dumps({"made": {"target": "h100"},
                                                        "cases": [entry]}))
    rc, results, log = run_runner(tmp_path)
    assert rc == 0, log
    row = results["cases"][0]
    assert row["ok"] and row["nonfinite"] == 0 and 0 < row["rel_err"] < 2e-3


def test_float8_weights_are_drawn_within_what_the_format_holds():
    """Float8 e4m3 values beyond 448 would cast to NaN: the draw clamps them first."""
    from bench.gpu_bundle import quant_draws
    from bench.gpu_runner import draw

    entry = {"inputs": {"w_qdata": {"shape": [256, 256], "dtype": "float8_e4m3fn",
                                    "scale": 0.02},
                        "w_scale": {"shape": [256, 1], "dtype": "float32", "scale": 0.02}}}
    quant_draws(entry)
    drawn = draw(entry, "cpu", 1)
    q = drawn["w_qdata"].float()
    assert q.isfinite().all() and q.abs().max() == 448 and q.std() > 50
    assert (drawn["w_scale"] > 0).all()


def test_a_candidate_finite_where_eager_overflows_is_held_to_float64():
    """H200, session 45: a tuning candidate of the unsafe qknorm computed finite values
    (2.1e-3 from float64) where eager float16 overflowed at every output (its relative error
    over no finite output: 0); it is accepted, garbage in its place is not, and one more
    non-finite output than eager always fails."""
    from bench.gpu_runner import accurate

    assert accurate(2.1e-3, 0, 0.0, 32768)
    assert not accurate(0.5, 0, 0.0, 32768)
    assert not accurate(2.1e-3, 0, 0.0, 0)  # eager finite everywhere: the usual bound
    assert accurate(1.4e-3, 0, 1e-3, 0) and not accurate(2.1e-3, 1, 0.0, 0)


def test_the_gemv_probe_checks_every_schedule_on_cpu(tmp_path):
    """``bench/gemv_probe.py --small`` under the interpreter: every schedule (rows, chunk,
    split with atomics, stages) computes ``x @ W.T`` within 1e-3 of float32."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = tmp_path / "g.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "gemv_probe.py"), "--device",
                        "cpu", "--small", "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) >= 40 and all(r["ok"] and r["rel_err"] < 1e-3 for r in rows)
    assert {r["schedule"]["split"] for r in rows} == {1, 4, 8}
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "gemv_probe.py"), "--device",
                        "cpu", "--small", "--int8", "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    result = json.loads(out.read_text())  # int8 codes, a scale per row applied after the sum
    assert result["weights"] == "int8" and len(result["rows"]) >= 40
    assert all(r["ok"] and r["rel_err"] < 1e-3 for r in result["rows"])


def test_measured_times_choose_each_pieces_plan_here(tmp_path, monkeypatch):
    """``ingest --measured`` keys the groups' times by plan; a search here tuned with them
    (``RecordedTimer``, as ``export --measured`` runs it) takes, piece by piece, the plan
    the runner measured fastest, eager included, and its report says so."""
    from bench.gpu_bundle import main
    from eqsat_mirage.runtime.timing import RecordedTimer, plan_key

    monkeypatch.setenv("EQSAT_MIRAGE_COMPILE_CHECK", "0")
    folder, manifest = tuning_bundle(tmp_path)
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = folder / "out.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_runner.py"), str(folder),
                        "--out", str(out), "--device", "cpu", "--sets", "1", "--stub-times"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    path = tmp_path / "measured.json"
    assert main(["ingest", str(folder), str(out), "--measured", str(path)]) == 0
    timer = RecordedTimer.load(path)
    results = json.loads(out.read_text())
    assert timer.device.startswith("cpu|torch ")
    from bench.gpu_tuning import measured
    assert set(timer.times_us) == {plan_key(m["mugraph"]) for m in measured(manifest, results)}
    res = em.optimize(small(), cache=False, piece_ops=3, jobs=1, timer=timer,
                      time_limit_s=600)
    groups = {g["piece"]: g for g in manifest["tuning"]}
    rows = {r["id"]: r for r in results["tuning"]}
    chosen = 0
    for entry, (_, optimized) in zip(res.stats["pieces"], res.pieces):
        group = groups[entry["index"]]
        tuned = rows[group["id"]]["tuned"]
        assert entry["tuned"]["chosen"] != "eager" or tuned == "eager"
        if tuned == "eager":
            assert not optimized and "eager form measured fastest" in entry["reason"]
            continue
        want = next(c["mugraph"] for c in group["candidates"] if c["name"] == tuned)
        times = entry["tuned"]["times_us"]
        best = times[entry["tuned"]["chosen"]]
        assert best == min(times.values()) == timer.times_us[plan_key(want)]  # the runner's
        # fastest, found here by its key; it stands when measured faster than eager (a tie
        # leaves the model's rule to decide)
        assert optimized or best == times["eager"]
        chosen += 1
    assert chosen + sum(rows[g["id"]]["tuned"] == "eager" for g in groups.values()) == len(groups)
