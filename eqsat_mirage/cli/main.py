"""The ``eqsat-mirage`` command line.

    eqsat-mirage demo [--bench NAME] [--batch B] [--rewritten] [--no-cache | --cache-dir DIR]
    eqsat-mirage optimize PROGRAM.py [PROGRAM.py ...] [--jobs N] | --bench NAME [--batch B]
                          [--target T] [--rules F ...] [--no-cache | --cache-dir DIR]
    eqsat-mirage verify A.py B.py [--trials T] [--max-bound B] [--seed S]
    eqsat-mirage check-rules FILE_OR_FOLDER ...
    eqsat-mirage targets
    eqsat-mirage cache list | clear | path [--cache-dir DIR]
    eqsat-mirage bench-verify [--trials T] [--bench NAME] [--batch B] [--write FILE]
    eqsat-mirage bench --gpu [--bench NAME] [--batch B] [--reps N] [--write FILE] [--no-cache]

``demo`` optimizes a benchmark (default GQA, batch 1) and prints the search,
the chosen program and its verification (``--rewritten``: verify the
hand-rewritten form instead). ``optimize`` does the same for one or more
program files, with progress on stderr and a summary table (several files run
through ``em.optimize_many``, ``--jobs N`` worker processes at once).
``verify`` compares two programs, each a Python file that defines a
module-level ``program`` (an ``em.Graph``) or a function ``build()`` returning
one. ``check-rules`` tests rule files for soundness. Results of ``optimize``,
``demo`` and ``bench`` are kept in the results cache (``pipeline/cache.py``), so a
repeated run returns at once: ``--no-cache`` skips it, ``--cache-dir DIR``
uses another folder, ``cache list|clear|path`` shows, empties or locates it.

Exit status (every command):

    0  success: equivalent, sound, or a verified program faster than one kernel per op
    1  a negative answer: not equivalent, unsound, or optimize found nothing (no
       verified program faster than one kernel per op; a non-Lax program cannot
       be verified)
    2  usage or input error (``error: ...`` on stderr naming the file and line,
       no traceback)
"""

from __future__ import annotations

import argparse
import importlib
import os
import runpy
import sys
import traceback
from pathlib import Path
from types import ModuleType

from ..family.sizes import family_rows
from ..frontend.graph import Graph
from ..ir.errors import MirageError
from .parser import build_parser, search_keywords

EXIT_EQUIVALENT, EXIT_NOT_EQUIVALENT, EXIT_ERROR = 0, 1, 2
_REPO_ROOT = Path(__file__).resolve().parents[2]


def _bench_module(name: str) -> ModuleType:
    """``bench.<name>`` from the repository (bench/ is not part of the wheel)."""
    try:
        return importlib.import_module(f"bench.{name}")
    except ModuleNotFoundError as exc:
        if exc.name not in ("bench", f"bench.{name}"):
            raise
    if not (_REPO_ROOT / "bench" / f"{name}.py").is_file():
        raise MirageError(f"the benchmarks (bench/{name}.py) are not available: run "
                          "eqsat-mirage from a checkout of the repository")
    sys.path.insert(0, str(_REPO_ROOT))
    return importlib.import_module(f"bench.{name}")


def load_program(path: str, mugraph_ok: bool = False) -> Graph:
    """Run the Python file ``path`` and return its ``program`` or ``build()``'s result.

    With ``mugraph_ok`` an ``em.MuGraph`` is accepted too, from a Python file or
    from a MuGraph JSON file (``optimize --emit-json``).
    """
    if not os.path.isfile(path):
        raise MirageError(f"{path}: no such file")
    if mugraph_ok and path.endswith(".json"):
        from ..mugraph.program import MuGraph

        try:
            return MuGraph.from_json(Path(path).read_text())
        except (MirageError, ValueError, KeyError, TypeError) as exc:
            raise MirageError(f"{path}: not a MuGraph JSON file: {exc}") from None
    try:
        namespace = runpy.run_path(path, run_name="__eqsat_mirage_program__")
    except MirageError as exc:
        raise MirageError(f"{path}: {exc}") from None
    except Exception as exc:  # any failure of the user's file is reported, by file and line
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if os.path.abspath(f.filename) == os.path.abspath(path)]
        where = f" (line {frames[-1].lineno})" if frames else ""
        if isinstance(exc, SyntaxError) and exc.lineno is not None:
            where = f" (line {exc.lineno})"
        raise MirageError(f"{path}{where}: running it failed: {type(exc).__name__}: "
                          f"{exc}") from None
    if "program" in namespace:
        program, what = namespace["program"], "`program`"
    elif callable(namespace.get("build")):
        try:
            program = namespace["build"]()
        except MirageError as exc:
            raise MirageError(f"{path}: build(): {exc}") from None
        what = "`build()`"
    else:
        raise MirageError(f"{path} defines neither a module-level `program` (an em.Graph) "
                          "nor a function `build()` returning one")
    from ..mugraph.program import MuGraph

    if not isinstance(program, Graph) and not (mugraph_ok and isinstance(program, MuGraph)):
        want = "an em.Graph or em.MuGraph" if mugraph_ok else "an em.Graph"
        raise MirageError(f"{path}: {what} is a {type(program).__name__}, not {want}")
    return program


def _print_result(result, indent: str = "") -> None:
    print(f"{indent}{result}")
    if result.equivalent:
        print(f"{indent}per-trial bound {result.per_trial_bound:.3g}, {result.trials} trials "
              f"-> false-positive bound {result.false_positive_bound:.3g} "
              f"(at most {result.max_bound:g}; primes drawn per trial, last p = {result.p}, "
              f"q = {result.q})")


class Progress:
    """Progress lines on stderr: rewritten in place on a terminal, one per line otherwise."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self._width = 0

    def __call__(self, message: str) -> None:
        if self.quiet:
            return
        if self.tty:
            pad = max(0, self._width - len(message))
            sys.stderr.write("\r" + message + " " * pad)
            self._width = len(message)
        else:
            sys.stderr.write(message + "\n")
        sys.stderr.flush()

    def done(self) -> None:
        """End the in-place line."""
        if self.tty and self._width and not self.quiet:
            sys.stderr.write("\n")
            sys.stderr.flush()
        self._width = 0


def summary(res) -> str:
    """A table of what the search did: phases, rules fired, extraction, verification, cost."""
    st = res.stats
    if "pieces" in st:  # a whole program: one line per piece, then the whole
        from ..pipeline.result import format_pieces

        rows = [f"pieces       {len(st['pieces'])} (partition {st['partition_seconds']:.2f} s, "
                f"stitch and end-to-end check {st.get('stitch_seconds', 0):.2f} s)"]
        rows += ["  " + line for line in format_pieces(st["pieces"])]
        rows += [f"kernels      {st.get('kernels', '?')} ({st.get('custom_kernels', 0)} custom)",
                 f"verified     {res.verified}",
                 f"cost         {res.baseline_cost_us:.2f} us (one kernel per op) -> "
                 f"{res.cost_us:.2f} us ({res.speedup:.2f}x, target {st.get('target', '?')})",
                 f"total        {st.get('seconds', 0):.2f} s"]
        if st.get("note"):
            rows.append(f"note         {st['note']}")
        return "\n".join(rows)
    rows = [f"{'phase':<12}{'iterations':>11}{'e-nodes':>10}{'seconds':>9}  stop"]
    for ph in st.get("phases", []):
        rows.append(f"{ph['name']:<12}{ph['iterations']:>11}{ph['enodes']:>10}"
                    f"{ph['seconds']:>9.2f}  {ph['stop']}")
    from ..egraph.rule_report import printable

    fired: dict[str, int] = {}
    for ph in st.get("phases", []):
        for rule, n in ph.get("rules_fired", {}).items():
            fired[rule] = fired.get(rule, 0) + n
    if fired:
        rows.append("")
        rows.append("rules fired (matches):")
        for rule, n in sorted(fired.items(), key=lambda kv: -kv[1])[:12]:
            rows.append(f"  {n:>7}  {printable(rule)}")  # a rule name is a comment
    rows.append("")
    rows.append(f"extraction   {st.get('candidates', 0)} candidates, "
                f"{st.get('candidates_tried', 0)} tried, {st.get('extract_seconds', 0):.2f} s")
    if "kernels" in st:
        rows.append(f"kernels      {st['kernels']} ({st.get('custom_kernels', 0)} custom)")
    for line in (res.plan.report().splitlines() if getattr(res, "plan", None) else [])[:12]:
        rows.append(f"  {line}")
    comp = st.get("compiled")
    if comp:  # the compile check: the chosen plan's build, what it refused
        chosen = next((b.split(": ", 1)[1] for b in reversed(comp["builds"])), "none built")
        rows.append(f"compiled     {chosen}" + (f"; {len(comp['refused'])} schedule(s) refused "
                                                f"and re-planned" if comp["refused"] else ""))
    rows.append(f"verified     {res.verified}")
    rows += family_rows(st.get("family"))
    roof = getattr(res, "roofline_us", None)
    rows.append(f"cost         {res.baseline_cost_us:.2f} us (one kernel per op) -> "
                f"{res.cost_us:.2f} us ({res.speedup:.2f}x, target {st.get('target', '?')})"
                + (f"; roofline {roof:.2f} us" if roof else ""))
    rows.append(f"total        {st.get('seconds', 0):.2f} s")
    if st.get("cache") == "hit":
        rows.append(f"cache        hit (key {st.get('cache_key', '?')}, "
                    f"{st.get('cache_seconds', 0):.3f} s; the search above is the stored one)")
    elif st.get("cache"):
        rows.append(f"cache        {st['cache']}"
                    + (f" (stored as {st['cache_key']})" if st.get("cache_key") else ""))
    return "\n".join(rows)


def _status(res) -> int:
    """0 when ``res`` is a verified program faster than one kernel per op, else 1."""
    ok = res.verified is not None and res.verified.equivalent
    return EXIT_EQUIVALENT if ok and res.cost_us < res.baseline_cost_us else EXIT_NOT_EQUIVALENT


def _cache_arg(args: argparse.Namespace):
    """``optimize``'s ``cache=`` from --no-cache / --cache-dir."""
    from ..pipeline.cache import FILENAME, ResultCache

    if getattr(args, "no_cache", False):
        return False
    cache_dir = getattr(args, "cache_dir", None)
    return ResultCache(Path(cache_dir) / FILENAME) if cache_dir else True


def _optimize_kwargs(args: argparse.Namespace) -> dict:
    return {**search_keywords(args), "cache": _cache_arg(args)}


def _optimize_and_report(graph, args: argparse.Namespace) -> int:
    from ..pipeline.optimize import optimize

    progress = Progress(getattr(args, "quiet", False))
    try:
        res = optimize(graph, progress=progress, **_optimize_kwargs(args))
    finally:
        progress.done()
    print("input program:")
    print(graph)
    print("\nchosen program:")
    print(res.program)
    print()
    print(summary(res))
    if getattr(args, "emit", None):
        Path(args.emit).write_text(res.triton_source())
        print(f"\nwrote the Triton module to {args.emit}")
    if getattr(args, "emit_json", None):
        Path(args.emit_json).write_text(res.program.to_json() if hasattr(res.program, "to_json")
                                        else str(res.program))
    if getattr(args, "render", None):
        print(f"\nwrote the picture (input and chosen program) to {res.render(args.render)}")
    return _status(res)


def _optimize_several(paths: list[str], graphs: list[Graph], args: argparse.Namespace) -> int:
    """Optimize several program files through ``optimize_many``: reports and a table."""
    from ..pipeline.many import optimize_many

    def line(message: str) -> None:
        if not args.quiet:
            print(message, file=sys.stderr, flush=True)

    results = optimize_many(graphs, jobs=args.jobs, errors="return", progress=line,
                            **_optimize_kwargs(args))
    status, rows = EXIT_EQUIVALENT, []
    for path, graph, res in zip(paths, graphs, results):
        print(f"== {path} ==")
        if isinstance(res, BaseException):
            print(f"error: {path}: {type(res).__name__}: {res}", file=sys.stderr)
            print(f"error: {type(res).__name__}: {res}\n")
            status = EXIT_ERROR
            rows.append(f"{path:<24} {graph.name:<16} {'error':>10}")
            continue
        print(res.program)
        print()
        print(summary(res))
        print()
        code = _status(res)
        status = max(status, code)
        rows.append(f"{path:<24} {graph.name:<16} {res.baseline_cost_us:>10.2f} "
                    f"{res.cost_us:>10.2f} {res.speedup:>7.2f}x {res.stats.get('cache', '?'):>6}"
                    f"  {'found' if code == EXIT_EQUIVALENT else 'nothing'}")
    print(f"{'file':<24} {'program':<16} {'1/op us':>10} {'chosen us':>10} {'speedup':>8} "
          f"{'cache':>6}  result")
    print("\n".join(rows))
    return status


def cmd_optimize(args: argparse.Namespace) -> int:
    """Optimize program files (or a benchmark) and print the search and its result."""
    if bool(args.programs) == (args.bench is not None):
        raise MirageError("optimize: give either PROGRAM.py or --bench NAME (one or more files)")
    if args.jobs < 1:
        raise MirageError(f"optimize: --jobs must be at least 1, got {args.jobs}")
    if args.bench is not None:
        return _optimize_and_report(_bench_module("programs").program(args.bench, args.batch),
                                    args)
    graphs = [load_program(p) for p in args.programs]
    if len(graphs) == 1:
        return _optimize_and_report(graphs[0], args)
    if args.emit or args.emit_json or args.render:
        raise MirageError("optimize: --emit, --emit-json and --render take a single program")
    return _optimize_several(args.programs, graphs, args)


def cmd_cache(args: argparse.Namespace) -> int:
    """``cache list`` / ``clear`` / ``path``: the results cache."""
    import sqlite3

    from ..pipeline.cache import FILENAME, ResultCache, format_entries

    store = ResultCache(Path(args.cache_dir) / FILENAME if args.cache_dir else None)
    if args.action == "path":
        print(store.path)
        return EXIT_EQUIVALENT
    try:
        if args.action == "clear":
            print(f"removed {store.clear()} cached results from {store.path}")
            return EXIT_EQUIVALENT
        entries = store.entries()
    except (sqlite3.Error, OSError) as exc:
        raise MirageError(f"results cache {store.path}: {exc}") from None
    if not entries:
        print(f"no cached results in {store.path}")
        return EXIT_EQUIVALENT
    print(f"{len(entries)} cached results in {store.path}")
    print(format_entries(entries))
    return EXIT_EQUIVALENT


def cmd_check_rules(args: argparse.Namespace) -> int:
    """Check rule files for soundness and print the table."""
    from ..egraph.check_rules import check_rules

    report = check_rules(args.paths, instances=args.instances, seed=args.seed)
    print(report)
    return EXIT_EQUIVALENT if report.ok else EXIT_NOT_EQUIVALENT


def cmd_targets(args: argparse.Namespace) -> int:
    """List the built-in hardware profiles."""
    from ..cost.profile import GPUProfile, builtin_profiles

    for path in builtin_profiles():
        prof = GPUProfile.load(path)
        calibrated = f"; calibrated on a GPU: {len(prof.calibrated)} figures" \
            if prof.calibrated else ""
        print(f"{path.stem:<8} {getattr(prof, 'description', '') or prof.name}  ({path}"
              f"{calibrated})")
    return EXIT_EQUIVALENT


def cmd_demo(args: argparse.Namespace) -> int:
    """Optimize a benchmark (or verify its hand-rewritten form) and print the result."""
    from ..verifier.verify import verify

    if not args.rewritten:
        graph = _bench_module("programs").program(args.bench, args.batch)
        print(f"# eqsat-mirage demo: optimizing benchmark {args.bench}, batch size "
              f"{args.batch}, for {args.target}\n")
        return _optimize_and_report(graph, args)

    programs = _bench_module("programs")
    original = programs.program(args.bench, args.batch)
    candidate = programs.rewritten(args.bench, args.batch)
    print(f"# benchmark {args.bench}, batch size {args.batch}\n")
    print("input program:")
    print(original)
    print("\nrewritten program:")
    print(candidate)
    print(f"\nverifying (at least {args.trials} finite-field trials + float64 and native-dtype "
          f"checks, seed {args.seed}) ...")
    result = verify(original, candidate, trials=args.trials, seed=args.seed)
    _print_result(result)
    return EXIT_EQUIVALENT if result.equivalent else EXIT_NOT_EQUIVALENT


def cmd_verify(args: argparse.Namespace) -> int:
    """Verify the programs of two files against each other."""
    from ..verifier.verify import verify

    a, b = load_program(args.a, mugraph_ok=True), load_program(args.b, mugraph_ok=True)
    result = verify(a, b, trials=args.trials, seed=args.seed, max_bound=args.max_bound)
    print(f"{args.a} vs {args.b}:")
    _print_result(result, "  ")
    return EXIT_EQUIVALENT if result.equivalent else EXIT_NOT_EQUIVALENT


def cmd_bench_verify(args: argparse.Namespace) -> int:
    """The verification table of bench/verify_bench.py."""
    command = " ".join(["eqsat-mirage", *args.argv])
    return _bench_module("verify_bench").run(args, command)


def cmd_bench(args: argparse.Namespace) -> int:
    """The GPU timings table of bench/gpu_bench.py (its optimizations through the cache)."""
    command = " ".join(["eqsat-mirage", *args.argv])
    old = dict(os.environ)
    if getattr(args, "no_cache", False):
        os.environ["EQSAT_MIRAGE_CACHE"] = "off"
    elif getattr(args, "cache_dir", None):
        os.environ["EQSAT_MIRAGE_CACHE_DIR"] = str(args.cache_dir)
    try:
        return _bench_module("gpu_bench").run(args, command)
    finally:
        os.environ.clear()
        os.environ.update(old)


def parser():
    """The ``eqsat-mirage`` argument parser, bound to this module's commands."""
    commands = {name[4:].replace("_", "-"): fn for name, fn in globals().items()
                if name.startswith("cmd_")}
    return build_parser(commands, _bench_module)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``eqsat-mirage`` console script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser().parse_args(argv)
    args.argv = argv
    try:
        return args.func(args)
    except MirageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
