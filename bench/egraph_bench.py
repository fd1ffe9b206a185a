"""The e-graph's size, time and memory per benchmark: every saturation phase as em.optimize
runs it (algebraic, tiling, block, thread; the built-in rules and facts), guards on and off.

    python bench/egraph_bench.py [--guards on off] [--only gqa]

Each (case, guards) runs in a fresh subprocess, so its memory is its own: the resident set
after the imports and the program are built, and this process's peak (VmHWM) after every
phase and after serializing the e-graph to the JSON that extraction reads; the growth is
what the e-graph costs: first loading the schema, guards, rules and program (egglog
compiles each rule: about 4 MB a rule, kept by the allocator and reused by the next
e-graph of the process), then what the phases and the JSON add. Prints a Markdown table:
tensor e-nodes after each phase, seconds per phase, how the last phase stopped, the
serialized JSON's size and the memory growth (loading, then the phases and serializing).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PHASES = ("algebraic", "tiling", "block", "thread")


def rss_bytes() -> int:
    """This process's resident set now (VmRSS)."""
    with open("/proc/self/status") as f:
        return int(next(ln for ln in f if ln.startswith("VmRSS:")).split()[1]) * 1024


def one(name: str, batch: int, guards: bool) -> dict:
    """Saturate ``program(name, batch)`` phase by phase (in this process); its figures."""
    from bench.memory_bench import peak_bytes as peak_of_process
    from bench.programs import program
    from eqsat_mirage.egraph.rulefiles import load_rule_files
    from eqsat_mirage.egraph.saturate import DEFAULT_PHASES, Limits, Saturator
    from eqsat_mirage.pipeline.options import DEFAULT_SPLITS
    from eqsat_mirage.pipeline.search import candidate_splits

    graph = program(name, batch)
    rulesets, rule_list, facts = load_rule_files(("rules",))
    base = rss_bytes()
    high = [base]

    def peak_bytes() -> int:  # VmHWM can lag VmRSS (per-thread counters synced late): the
        high[0] = max(high[0], peak_of_process(), rss_bytes())  # most of both, ever read
        return high[0]

    start = time.perf_counter()
    sat = Saturator(graph, rulesets, rule_list, guards=guards, facts=facts,
                    splits=candidate_splits(graph, DEFAULT_SPLITS))
    row = {"case": f"{name} b={batch}", "guards": guards, "setup_s": time.perf_counter() - start,
           "phases": [], "loaded": peak_bytes() - base}
    for phase, rs in DEFAULT_PHASES:
        rs = tuple(r for r in rs if r in rulesets)
        if rs:
            st = sat.run_phase(phase, rs, Limits())
            row["phases"].append({"name": phase, "enodes": sat.size(), "seconds": st.seconds,
                                  "stop": st.stop, "peak": peak_bytes() - base})
    t = time.perf_counter()
    data = sat.serialize()
    row["serialize_s"] = time.perf_counter() - t
    row["json_bytes"] = len(json.dumps(data))
    row["all_enodes"] = sat.size("all")
    row["peak"] = peak_bytes() - base
    return row


def table(rows: list[dict]) -> str:
    """The rows as Markdown."""
    head = ("| case | guards | " + " | ".join(f"{p} e-nodes" for p in PHASES)
            + " | seconds per phase | last stop | all e-nodes | JSON MB | memory MB: loading"
            " + phases |")
    lines = [head, "|---|---|" + "---:|" * len(PHASES) + "---|---|---:|---:|---:|"]
    for r in rows:
        by = {p["name"]: p for p in r["phases"]}
        nodes = " | ".join(str(by[p]["enodes"]) if p in by else "-" for p in PHASES)
        secs = " / ".join(f"{by[p]['seconds']:.2f}" for p in PHASES if p in by)
        last = r["phases"][-1]["stop"] if r["phases"] else "-"
        lines.append(f"| {r['case']} | {'on' if r['guards'] else 'off'} | {nodes} | {secs} | "
                     f"{last} | {r['all_enodes']} | {r['json_bytes'] / 1e6:.2f} | "
                     f"{r['loaded'] / 1e6:.0f} + {(r['peak'] - r['loaded']) / 1e6:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    """Run every case in its own subprocess and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--guards", nargs="+", choices=("on", "off"), default=["on", "off"])
    ap.add_argument("--only", help="run the benchmarks whose name starts so")
    ap.add_argument("--one", nargs=3, metavar=("NAME", "BATCH", "GUARDS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        name, batch, guards = args.one
        print(json.dumps(one(name, int(batch), guards == "on")))
        return 0
    from bench.programs import cases

    rows = []
    for name, batch in cases():
        if args.only and not name.startswith(args.only):
            continue
        for g in args.guards:
            done = subprocess.run([sys.executable, __file__, "--one", name, str(batch), g],
                                  capture_output=True, text=True, check=True, cwd=ROOT)
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
