"""The planner against brute force on a fixed set of small programs (``bench/brute_force.py``).

    python bench/brute_force_bench.py [--random N] [--limit S] [--no-cache] [--json PATH]
                                      [--all] [--only PREFIX]... [--optimize PREFIX]
                                      [--no-compile-check] [--optimize-time S]

Programs: the benchmark inputs, rewritten and safe forms of ``bench/programs.py`` (batches
1 and 8) whole when they have at most ``MAX_OPS`` ops, else every window of ``MAX_OPS``
consecutive ops (topological order), and random programs from
``eqsat_mirage.testing.programs`` (drawn deterministically, N at dims up to 6 and N at dims
up to 64); duplicates equal up to names are dropped. Prints the summary (how many equal,
the worst ratio, where the planner loses), every row with ``--all``. ``--only PREFIX``
(repeatable) keeps the programs whose label starts with one of the PREFIXes.
``--optimize PREFIX`` also runs ``em.optimize`` (its defaults, the compile check on where
Triton's NVIDIA compiler is installed unless ``--no-compile-check``, but a time limit of
``--optimize-time`` seconds, 3600 unless told) on the programs whose
label starts with PREFIX ("" for all) and sets its returned cost against the brute force
over the program as written.

Cached: finished comparisons are kept in ``brute_force.json`` beside the results cache
(``pipeline.cache.default_dir()``), keyed by the program, the package's source digest, the
target profile and the strategy, so a rerun with an unchanged planner prices nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.brute_force import (  # noqa: E402
    EQUAL_RTOL,
    MAX_OPS,
    TIME_LIMIT_S,
    BruteResult,
    Comparison,
    Pricer,
    Space,
    compare,
    shape_key,
    summarize,
)
from eqsat_mirage.frontend.graph import Graph  # noqa: E402

# -- the fixed set of programs ---------------------------------------------------------------


def windows(label: str, graph: Graph, size: int = MAX_OPS) -> list[tuple[str, Graph]]:
    """Every run of ``size`` consecutive ops (in ``graph.nodes()`` order) of ``graph`` as a
    program of its own (labels ``label[i:j]``); ``graph`` itself when it is no larger."""
    space = Space(graph)
    n = len(space.ops)
    if n <= size:
        return [(label, graph)]
    return [(f"{label}[{i}:{i + size}]",
             space.fragment(frozenset(range(i, i + size)), f"{graph.name}_{i}"))
            for i in range(n - size + 1)]


def benchmark_programs(size: int = MAX_OPS) -> list[tuple[str, Graph]]:
    """The benchmark inputs, rewritten forms and safe forms of ``bench/programs.py`` at
    batches 1 and 8 (lora and gatedmlp once: their shapes do not depend on the batch), whole
    when at most ``size`` ops, else as ``windows``."""
    from bench import programs as bp

    out: list[tuple[str, Graph]] = []
    for name in [*bp.BENCHMARKS, *bp.SAFE]:
        for batch in bp.BATCHES:
            if batch > 1 and name in ("lora", "gatedmlp"):
                continue
            out += windows(f"{name} b={batch}", bp.program(name, batch), size)
            if name in bp.REWRITTEN:
                out += windows(f"{name} b={batch} rewritten", bp.rewritten(name, batch), size)
    return out


def random_programs(n: int, max_dim: int, max_ops: int = MAX_OPS) -> list[Graph]:
    """``n`` distinct programs of 2 to ``max_ops`` ops from ``testing.programs``, the same on
    every run (hypothesis, derandomized, no example database)."""
    from hypothesis import HealthCheck, Phase, given, settings

    from eqsat_mirage.testing import programs

    found: dict[tuple, Graph] = {}

    @settings(max_examples=10 * n, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(programs(max_ops=max_ops, max_dim=max_dim))
    def draw(g: Graph) -> None:
        ops = len(Space(g).ops)
        if len(found) < n and 2 <= ops <= max_ops:
            found.setdefault(shape_key(g), g)

    draw()
    return list(found.values())


def fixed_set(random_n: int = 24) -> list[tuple[str, Graph]]:
    """The programs the figures cover: ``benchmark_programs`` and ``random_n`` random
    programs at dims up to 6 and ``random_n`` at dims up to 64, duplicates (equal up to
    names) dropped."""
    progs = benchmark_programs()
    progs += [(f"random d<=6 #{i}", g) for i, g in enumerate(random_programs(random_n, 6))]
    progs += [(f"random d<=64 #{i}", g) for i, g in enumerate(random_programs(random_n, 64))]
    seen: set[tuple] = set()
    out = []
    for label, g in progs:
        key = shape_key(g)
        if key not in seen:
            seen.add(key)
            out.append((label, g))
    return out


# -- running, caching, reporting -------------------------------------------------------------

# em.optimize's time limit here: its default (60 s) cuts a benchmark program's search short on
# a loaded 2-core machine (gqa b=8 then returns its input), so the figures would be the load's
OPTIMIZE_TIME_S = 3600.0


def cache_path() -> Path:
    """``brute_force.json`` in the results cache's folder."""
    from eqsat_mirage.pipeline.cache import default_dir

    return default_dir() / "brute_force.json"


def cache_key(graph: Graph, pricer: Pricer) -> str:
    """The sha256 of the program, the package's sources, the target and the strategy."""
    from eqsat_mirage.pipeline.cache import code_digest, program_text, target_digest

    text = json.dumps([program_text(graph), code_digest(), target_digest(pricer.prof.name),
                       repr(pricer.strategy), MAX_OPS])
    return hashlib.sha256(text.encode()).hexdigest()


def run(progs: list[tuple[str, Graph]], pricer: Pricer | None = None,
        time_limit_s: float = TIME_LIMIT_S, cache: Path | None = None,
        progress=None) -> tuple[list[Comparison], list[str]]:
    """Compare every program of ``progs``; returns the comparisons and the labels skipped
    (over ``MAX_OPS`` ops). ``cache``: a JSON file of finished comparisons (read and
    updated; incomplete ones are not kept)."""
    pricer = pricer or Pricer()
    stored = json.loads(cache.read_text()) if cache is not None and cache.is_file() else {}
    out, skipped = [], []
    for label, g in progs:
        if len(Space(g).ops) > MAX_OPS:
            skipped.append(label)
            continue
        key = cache_key(g, pricer) if cache is not None else None
        if key in stored:
            data = dict(stored[key], label=label)
            c = Comparison(**{**data, "brute": BruteResult(**data["brute"])}, cached=True)
        else:
            c = compare(label, g, pricer, time_limit_s)
            if key is not None and c.brute.complete:
                stored[key] = {k: v for k, v in asdict(c).items() if k != "cached"}
        out.append(c)
        if progress:
            progress(row(c))
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")  # whole or not at all
        tmp.write_text(json.dumps(stored, indent=0))
        tmp.replace(cache)
    return out, skipped


def row(c: Comparison) -> str:
    """One Markdown table row."""
    return (f"| {c.label} | {c.ops} | {c.planner_us:.2f} | {len(c.planner_regions)} | "
            f"{c.brute.cost_us:.2f} | {len(c.brute.regions)} | {c.ratio:.3f} | "
            f"{c.brute.acyclic}/{c.brute.partitions} | {c.brute.seconds:.1f}"
            f"{'' if c.brute.complete else ' (incomplete)'} |")


HEADER = ("| program | ops | planner us | kernels | brute force us | kernels | ratio | "
          "acyclic partitions | s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|")


def report(comps: list[Comparison], skipped: list[str]) -> str:
    """The summary line and the programs where the planner loses, as Markdown."""
    s = summarize(comps, skipped)
    lines = [str(s), "", HEADER] + [row(c) for c in s.losers]
    for c in s.losers:
        lines.append(f"- {c.label}: planner kernels {c.planner_regions}, brute force "
                     f"{c.brute.regions}")
    return "\n".join(lines)


@dataclass
class OptimizeRow:
    """``em.optimize``'s returned cost for one program against the brute force over the
    program as written (``ratio`` 1.0 or below: at most the brute force's cost; below:
    another algebraic form is cheaper than any partition of the program as written)."""

    label: str
    optimize_us: float
    brute_us: float
    verified: bool  # the returned program passed em.verify (the input: checked against itself)
    how: str  # which planned form won ("input" when the input itself was returned)
    seconds: float
    replans: int = 0  # plans the compile check sent back to the planner
    time_limited: bool = False  # the time limit cut the search short

    @property
    def ratio(self) -> float:
        """em.optimize over brute force."""
        return 1.0 if self.optimize_us == self.brute_us else self.optimize_us / self.brute_us

    @property
    def at_most(self) -> bool:
        """Whether em.optimize costs at most the brute force (within ``EQUAL_RTOL``)."""
        return self.ratio <= 1 + EQUAL_RTOL

    @property
    def cheaper(self) -> bool:
        """Whether em.optimize found a form strictly cheaper than the brute force's."""
        return self.ratio < 1 - EQUAL_RTOL


def optimize_row(label: str, graph: Graph, brute_us: float, compile_check: bool | None = None,
                 cache: bool = True, time_limit_s: float = OPTIMIZE_TIME_S) -> OptimizeRow:
    """``em.optimize(graph)`` (its defaults but the time limit; ``compile_check`` None: on
    where it can run) against ``brute_us``, the brute force's cost over ``graph`` as
    written."""
    import eqsat_mirage as em

    t = time.perf_counter()
    res = em.optimize(graph, compile_check=compile_check, cache=cache,
                      time_limit_s=time_limit_s)
    seconds = time.perf_counter() - t
    won = [p["how"] for p in res.stats.get("plans", []) if p.get("verified")]
    compiled = res.stats.get("compiled") or {}
    return OptimizeRow(label, res.cost_us, brute_us,
                       res.verified is not None and res.verified.equivalent,
                       won[0] if won else "input", seconds, compiled.get("replans", 0),
                       bool(res.stats.get("time_limited")))


def optimize_rows(comps: list[Comparison], graphs: dict[str, Graph], prefix: str = "",
                  compile_check: bool | None = None, cache: bool = True,
                  time_limit_s: float = OPTIMIZE_TIME_S, progress=None) -> list[OptimizeRow]:
    """``optimize_row`` for every complete comparison whose label starts with ``prefix``."""
    rows = []
    for c in comps:
        if c.label.startswith(prefix) and c.brute.complete:
            rows.append(optimize_row(c.label, graphs[c.label], c.brute.cost_us,
                                     compile_check, cache, time_limit_s))
            if progress:
                r = rows[-1]
                progress(f"em.optimize {r.label}: {r.optimize_us:.4f} us, brute force "
                         f"{r.brute_us:.4f} us ({r.ratio:.3f}x, {r.how}, {r.seconds:.1f} s"
                         f"{', time-limited' if r.time_limited else ''})")
    return rows


def optimize_summary(rows: list[OptimizeRow]) -> str:
    """How many of ``rows`` cost at most the brute force, how many less, the worst ratio."""
    if not rows:
        return "em.optimize: no program"
    worst = max(rows, key=lambda r: r.ratio)
    at_most = sum(r.at_most for r in rows)
    return (f"em.optimize on {len(rows)} programs: {at_most} at most the brute force's cost "
            f"({100 * at_most / len(rows):.1f}%, {sum(r.cheaper for r in rows)} strictly "
            f"cheaper), worst ratio {worst.ratio:.3f}x ({worst.label}), "
            f"{sum(not r.verified for r in rows)} unverified, "
            f"{sum(r.time_limited for r in rows)} cut short by the time limit, "
            f"{sum(r.seconds for r in rows):.1f} s")


def optimize_report(rows: list[OptimizeRow]) -> str:
    """``optimize_summary`` and a line per program where em.optimize costs more."""
    lines = [optimize_summary(rows)]
    lines += [f"- {r.label}: em.optimize {r.optimize_us:.4f} us ({r.how}), brute force "
              f"{r.brute_us:.4f} us ({r.ratio:.3f}x)"
              for r in sorted(rows, key=lambda r: -r.ratio) if not r.at_most]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--random", type=int, default=24,
                    help="random programs per dimension bound (6 and 64)")
    ap.add_argument("--limit", type=float, default=TIME_LIMIT_S,
                    help="seconds per program's enumeration")
    ap.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    ap.add_argument("--json", type=Path, help="write every comparison here")
    ap.add_argument("--all", action="store_true", help="print every program's row")
    ap.add_argument("--only", metavar="PREFIX", action="append",
                    help="keep only the programs whose label starts with PREFIX (repeatable)")
    ap.add_argument("--optimize", metavar="PREFIX",
                    help="also run em.optimize on the programs whose label starts with PREFIX")
    ap.add_argument("--no-compile-check", action="store_true",
                    help="em.optimize with compile_check=False")
    ap.add_argument("--optimize-time", type=float, default=OPTIMIZE_TIME_S,
                    help="em.optimize's time_limit_s (seconds per program)")
    args = ap.parse_args(argv)
    t = time.perf_counter()
    progs = fixed_set(args.random)
    if args.only:
        progs = [(label, g) for label, g in progs if label.startswith(tuple(args.only))]
    comps, skipped = run(progs, Pricer(), args.limit, None if args.no_cache else cache_path(),
                         progress=(lambda line: print(line, file=sys.stderr)))
    if args.all:
        print(HEADER)
        print("\n".join(row(c) for c in comps))
        print()
    print(report(comps, skipped))
    rows = []
    if args.optimize is not None:
        rows = optimize_rows(comps, dict(progs), args.optimize,
                             False if args.no_compile_check else None,
                             time_limit_s=args.optimize_time,
                             progress=(lambda line: print(line, file=sys.stderr)))
        print()
        print(optimize_report(rows))
    print(f"\n{len(progs)} programs in {time.perf_counter() - t:.1f} s")
    if args.json:
        opt = {r.label: {**asdict(r), "ratio": r.ratio} for r in rows}
        args.json.write_text(json.dumps([{**asdict(c), "ratio": c.ratio,
                                          "optimize": opt.get(c.label)} for c in comps],
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
