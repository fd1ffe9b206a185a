"""Shape families: one search per family, the cost at every size, the plan's checks.

    python bench/dynamic_bench.py [--write bench/RESULTS.md]

GQA (Q(2, 256, 64), K(2, 64, L), V(2, L, 64), the benchmark's b=1 shapes, exp without
the max as in Mirage's benchmark) with L = em.Dim("L", hint=4096): one search, the
family's cost at L = 4096..4200 against L/4096 (no cliffs: cost(L)/cost(4096) <= 1.1 L/4096),
and the static plan at L = 4096 for comparison. The gated MLP with a dynamic batch B
(hint 16, 1..64): one search, cost at each batch. Cost-model figures (h100 profile).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("EQSAT_MIRAGE_COMPILE_CHECK", "0")

import eqsat_mirage as em  # noqa: E402
from eqsat_mirage.cost.gpucost import mugraph_cost  # noqa: E402


def gqa(size):
    g = em.Graph("gqa_dyn" if not isinstance(size, int) else "gqa_static")
    q = g.input("Q", (2, 256, 64))
    k = g.input("K", (2, 64, size))
    v = g.input("V", (2, size, 64))
    a = em.exp(q @ k)
    g.output((a / a.sum(axis=2, keepdims=True)) @ v, "O")
    return g


def mlp(batch):
    g = em.Graph("gatedmlp_dyn")
    x = g.input("X", (batch, 4096))
    w1 = g.input("W1", (4096, 4096))
    w2 = g.input("W2", (4096, 4096))
    g.output(em.silu(x @ w1) * (x @ w2), "O")
    return g


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", help="replace the 'Shape families' section of this file")
    args = ap.parse_args()
    lines = ["## Shape families (dynamic sizes)", "",
             "`python bench/dynamic_bench.py --write bench/RESULTS.md` (cost model, h100 "
             "profile; CPU machine, no GPU).", ""]
    t = time.perf_counter()
    fam = em.optimize(gqa(em.Dim("L", hint=4096)), cache=False)
    t_fam = time.perf_counter() - t
    static = em.optimize(gqa(4096), cache=False)
    st = fam.stats["family"]
    base = mugraph_cost(fam.at(4096)).total_us
    worst = max((mugraph_cost(fam.at(n)).total_us / base) / (n / 4096)
                for n in range(4096, 4201))
    lines += [f"GQA b=1, L = Dim(hint=4096): one search, {t_fam:.1f} s; plan at L=4096 "
              f"{base:.2f} us, static plan {static.cost_us:.2f} us "
              f"(ratio {base / static.cost_us:.3f}, must be <= 1.1); granule {st['granule']}; "
              f"verified at L = {', '.join(str(s) for s, ok in st['verified_sizes'].items() if ok)}"
              f" (bound {max(st['bounds'].values()):.2g}).", "",
              f"No cliffs: max over L in 4096..4200 of (cost(L)/cost(4096)) / (L/4096) = "
              f"{worst:.3f} (must be <= 1.1).", "",
              "| L | cost us | cost / cost(4096) | L / 4096 |", "|---|---|---|---|"]
    for n in (4096, 4097, 4159, 4160, 4200, 5000, 8192):
        c = mugraph_cost(fam.at(n)).total_us
        lines.append(f"| {n} | {c:.2f} | {c / base:.3f} | {n / 4096:.3f} |")
    t = time.perf_counter()
    m = em.optimize(mlp(em.Dim("B", hint=16, max=64)), cache=False)
    t_m = time.perf_counter() - t
    ms = m.stats["family"]
    lines += ["", f"Gated MLP, X(B, 4096) with B = Dim(hint=16, max=64): one search, {t_m:.1f} s; "
              f"granule {ms['granule']}; fallback: {ms['fallback'] or 'none'}; verified at B = "
              f"{', '.join(str(s) for s, ok in ms['verified_sizes'].items() if ok)}.", "",
              "| B | cost us |", "|---|---|"]
    for b in (1, 8, 16, 17, 33, 64):
        lines.append(f"| {b} | {mugraph_cost(m.at(b)).total_us:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        from pathlib import Path

        p = Path(args.write)
        old = p.read_text()
        head = "## Shape families (dynamic sizes)"
        if head in old:
            pre, _, rest = old.partition(head)
            nxt = rest.find("\n## ")
            old = pre + (rest[nxt + 1:] if nxt >= 0 else "")
        p.write_text(old.rstrip("\n") + "\n\n" + text)


if __name__ == "__main__":
    main()
