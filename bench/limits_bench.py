"""Does ``time_limit_s`` bound a whole search? Explosive rule sets, measured.

    OPENBLAS_NUM_THREADS=1 python bench/limits_bench.py [--limits 2 5 10]

Each case runs ``em.optimize`` in a fresh subprocess (so its peak resident
memory is its own) on a program built to make rules explode: a sum of
products over 8 inputs. The rule sets are sound and written by a user:
"ac" (commutativity and associativity of + and *, distributivity both ways:
every regrouping of the sum is a new term) and "ac+40" (the same plus
``x + y -> (k * (x / k)) + y`` for 40 constants k: 46 rules). Prints a
Markdown table: wall seconds, their ratio to the limit, peak memory, the
e-nodes reached and how each phase stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

AC = """(ruleset boom)
(rewrite (Add a b) (Add b a) :ruleset boom)
(rewrite (Mul a b) (Mul b a) :ruleset boom)
(birewrite (Add a (Add b c)) (Add (Add a b) c) :ruleset boom)
(birewrite (Mul a (Mul b c)) (Mul (Mul a b) c) :ruleset boom)
(birewrite (Mul a (Add b c)) (Add (Mul a b) (Mul a c)) :ruleset boom)
"""


def rule_text(kind: str) -> str:
    """The rule file of set ``kind`` ("ac" or "ac+40")."""
    text = AC
    if kind == "ac+40":
        text += "".join(f"(rewrite (Add a b) (Add (Mul (Const {k}.0) (Div a (Const {k}.0))) b) "
                        f":ruleset boom)\n" for k in range(2, 42))
    return text


CHILD = """
import json, resource, sys, time
import eqsat_mirage as em
rules, limit, node_limit, guards = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
g = em.Graph("sumprod")
xs = [g.input(f"x{i}", (64, 64), dtype="float32") for i in range(8)]
y = xs[0] * xs[1]
for i in range(2, 8, 2):
    y = y + xs[i] * xs[i + 1]
g.output(y * (xs[0] + xs[3]), "y")
t = time.perf_counter()
res = em.optimize(g, rules=["rules", rules], time_limit_s=limit, node_limit=node_limit,
                  guards=guards == "on", cache=False, allow_unchecked_rules=True)
wall = time.perf_counter() - t
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"wall": wall, "rss_mb": rss, "enodes": res.stats.get("enodes"),
                  "stops": [f"{p['name']}: {p['stop']}" for p in res.stats.get("phases", [])],
                  "note": res.stats.get("note", ""), "verified": bool(res.verified and
                                                                res.verified.equivalent)}))
"""


def run_case(kind: str, limit: float, node_limit: int, guards: str, folder: str) -> dict:
    """One optimize in a subprocess; its JSON line."""
    path = Path(folder) / f"{kind}.egg"
    path.write_text(rule_text(kind))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), str(limit), str(node_limit),
                          guards], capture_output=True, text=True, env=env, timeout=20 * limit)
    if out.returncode != 0:
        raise SystemExit(f"case {kind} {limit} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    """Print the table for every (rule set, guards, node limit, time limit)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limits", type=float, nargs="+", default=[2.0, 5.0, 10.0])
    args = ap.parse_args(argv)
    print("| rules | guards | node_limit | time_limit_s | wall s | wall / limit | peak MB | "
          "e-nodes | phases stopped by | verified |\n"
          "|---|---|---:|---:|---:|---:|---:|---:|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for kind, guards, node_limit in (("ac", "off", 1000), ("ac+40", "off", 1000),
                                         ("ac+40", "off", 200_000), ("ac", "on", 200_000)):
            for limit in args.limits:
                r = run_case(kind, limit, node_limit, guards, folder)
                stops = "; ".join(r["stops"]) or r["note"]
                print(f"| {kind} | {guards} | {node_limit} | {limit:g} | {r['wall']:.2f} | "
                      f"{r['wall'] / limit:.2f} | {r['rss_mb']:.0f} | {r['enodes']} | {stops} | "
                      f"{r['verified']} |", flush=True)


if __name__ == "__main__":
    main()
