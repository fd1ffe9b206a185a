"""CPU seconds of one ``torch.compile`` of a Hugging Face case through ``em.backend``, per
phase (issue 51), on a machine loaded by other jobs.

    TRITON_INTERPRET=1 python bench/compile_cpu.py [float32|float16] [CASE] [--json FILE]

CASE is a ``bench/hf_models.case`` name (default ``llama_layer``: the README's tiny LLaMA
layer). Wall time on a shared machine carries the other tenants' load, so this measures
CPU time: this process's (every thread), its finished child processes' and the compile
check's live build child's (``codegen.buildserver``). The search's own clock
(``time.perf_counter``, read by every ``Deadline``) is replaced by this process's CPU time
plus its finished children's, so no pass is cut short by the load and the result is the
one a quiet machine gives with the work done (``em.backend(time_limit_s=1800)``, the cap).
Each pass is timed by wrapping its ``Search`` method (nested: ``run`` holds the others;
``Builder.clean`` is the compile check with its re-plans), plus the end-to-end check of
``pipeline/whole.py``. Prints the total, the plans (predicted us before -> after, per
piece) and the phases; ``--json FILE`` writes them.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import warnings
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import eqsat_mirage as em  # noqa: E402
import eqsat_mirage.pipeline.build as build  # noqa: E402
import eqsat_mirage.pipeline.search as search  # noqa: E402
import eqsat_mirage.pipeline.whole as whole  # noqa: E402
import eqsat_mirage.verifier.verify as verify  # noqa: E402
from bench.hf_models import case, first  # noqa: E402
from eqsat_mirage.codegen.buildserver import SERVER  # noqa: E402

WALL = time.perf_counter


def finished_cpu() -> float:
    """CPU seconds of this process (every thread) and of its finished children."""
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + c.ru_utime + c.ru_stime


def cpu() -> float:
    """``finished_cpu`` and the live build child's CPU seconds (from /proc)."""
    total, proc = finished_cpu(), SERVER.proc
    if proc is not None and proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            pass
    return total


def timed(owner, name: str, key: str, phases: dict) -> None:
    """Wrap ``owner.name`` so that its CPU seconds add up in ``phases[key]``."""
    fn = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t = cpu()
        try:
            return fn(*args, **kwargs)
        finally:
            phases[key] = phases.get(key, 0.0) + cpu() - t

    setattr(owner, name, wrapper)


def measure(dtype: str, name: str) -> dict:
    """Compile case ``name`` in ``dtype`` once; its CPU seconds, plans and phases."""
    import torch

    phases: dict[str, float] = {}
    for meth in ("run", "plan", "saturate", "extract", "build_and_verify", "verify"):
        timed(search.Search, meth, f"search.{meth}", phases)
    timed(build.Builder, "clean", "compile check (with re-plans)", phases)
    timed(verify, "float_checks", "float checks (in verify)", phases)
    timed(verify, "_trials", "field trials", phases)
    timed(whole, "end_to_end", "end-to-end float check", phases)
    time.perf_counter = time.monotonic = finished_cpu  # the search's clock: CPU seconds
    fn, args = case(name, dtype)
    torch._dynamo.reset()
    said: list[str] = []
    be = em.backend(warmup=0, cache=False, warn=False, time_limit_s=1800, progress=said.append)
    t0, w0 = cpu(), WALL()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = first(fn(*args)).float()
        got = first(torch.compile(fn, backend=be)(*args)).float()
    total, wall = cpu() - t0, WALL() - w0
    s = be.summary()
    pieces = []
    for e in be.report:
        if e.result is not None:
            pieces += [{k: p.get(k) for k in ("index", "status", "cost_before_us",
                                               "cost_after_us", "reason")}
                       for p in e.result.stats.get("pieces", [])]
    return {"case": name, "dtype": dtype, "cpu_s": total, "wall_s": wall,
            "ops": [s["optimized_ops"], s["ops"]], "predicted_us": s["predicted_us"],
            "error": float((got - want).abs().max() / want.abs().max()), "pieces": pieces,
            "phases": phases, "refusals": [x for x in said if "rejected" in x or "refused" in x]}


def main(argv: list[str]) -> None:
    """Parse ``argv``, measure, print (and write ``--json``)."""
    out = argv[argv.index("--json") + 1] if "--json" in argv else None
    rest = [a for i, a in enumerate(argv) if a != "--json" and (i == 0 or argv[i - 1] != "--json")]
    dtype = rest[0] if rest else "float32"
    got = measure(dtype, rest[1] if len(rest) > 1 else "llama_layer")
    print(f"{got['case']} {dtype}: {got['cpu_s']:.1f} CPU s ({got['wall_s']:.1f} s wall); "
          f"{got['ops'][0]} of {got['ops'][1]} ops optimized; predicted us "
          f"{got['predicted_us']}")
    for p in got["pieces"]:
        print(f"  piece {p['index']}: {p['status']}, {p['cost_before_us']:.2f} -> "
              f"{p['cost_after_us']:.2f} us ({p['reason']})")
    for key, sec in sorted(got["phases"].items(), key=lambda kv: -kv[1]):
        print(f"  {key:32s} {sec:7.2f} CPU s")
    for line in got["refusals"]:
        print(f"  {line[:200]}")
    if out:
        Path(out).write_text(json.dumps(got, indent=1, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
