"""The ``eqsat-mirage`` command line.

    eqsat-mirage demo [--bench NAME] [--batch B] [--rewritten]
    eqsat-mirage optimize PROGRAM.py | --bench NAME [--batch B] [--target T] [--rules F ...]
    eqsat-mirage verify A.py B.py [--trials T] [--seed S]
    eqsat-mirage check-rules FILE_OR_FOLDER ...
    eqsat-mirage targets
    eqsat-mirage bench-verify [--trials T] [--bench NAME] [--batch B] [--write FILE]
    eqsat-mirage bench --gpu [--bench NAME] [--batch B] [--reps N] [--write FILE]

``demo`` optimizes a benchmark (default GQA, batch 1) and prints the search,
the chosen program and its verification (``--rewritten``: verify the
hand-rewritten form instead). ``optimize`` does the same for a program file,
with progress on stderr and a summary table. ``verify`` compares two programs,
each a Python file that defines a module-level ``program`` (an ``em.Graph``)
or a function ``build()`` returning one. ``check-rules`` tests rule files for
soundness. Exit status: 0 success / equivalent / sound, 1 not equivalent /
unsound, 2 error (a library error prints ``error: ...``, no traceback).
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

from .errors import MirageError
from .graph import Graph

EXIT_EQUIVALENT, EXIT_NOT_EQUIVALENT, EXIT_ERROR = 0, 1, 2
_REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_NAMES = ("gqa", "qknorm", "rmsnorm", "lora", "gatedmlp", "ntrans")  # bench/programs.py


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


def load_program(path: str) -> Graph:
    """Run the Python file ``path`` and return its ``program`` or ``build()``'s result."""
    if not os.path.isfile(path):
        raise MirageError(f"{path}: no such file")
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
    if not isinstance(program, Graph):
        raise MirageError(f"{path}: {what} is a {type(program).__name__}, not an em.Graph")
    return program


def _print_result(result, indent: str = "") -> None:
    print(f"{indent}{result}")
    if result.equivalent:
        print(f"{indent}per-trial bound {result.per_trial_bound:.3g}, {result.trials} trials "
              f"-> false-positive bound {result.false_positive_bound:.3g} "
              f"(p = {result.p}, q = {result.q})")


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
    rows = [f"{'phase':<12}{'iterations':>11}{'e-nodes':>10}{'seconds':>9}  stop"]
    for ph in st.get("phases", []):
        rows.append(f"{ph['name']:<12}{ph['iterations']:>11}{ph['enodes']:>10}"
                    f"{ph['seconds']:>9.2f}  {ph['stop']}")
    fired: dict[str, int] = {}
    for ph in st.get("phases", []):
        for rule, n in ph.get("rules_fired", {}).items():
            fired[rule] = fired.get(rule, 0) + n
    if fired:
        rows.append("")
        rows.append("rules fired (matches):")
        for rule, n in sorted(fired.items(), key=lambda kv: -kv[1])[:12]:
            rows.append(f"  {n:>7}  {rule}")
    rows.append("")
    rows.append(f"extraction   {st.get('candidates', 0)} candidates, "
                f"{st.get('candidates_tried', 0)} tried, {st.get('extract_seconds', 0):.2f} s")
    if "kernels" in st:
        rows.append(f"kernels      {st['kernels']} ({st.get('custom_kernels', 0)} custom)")
    for line in (res.plan.report().splitlines() if getattr(res, "plan", None) else [])[:12]:
        rows.append(f"  {line}")
    rows.append(f"verified     {res.verified}")
    roof = getattr(res, "roofline_us", None)
    rows.append(f"cost         {res.baseline_cost_us:.2f} us (one kernel per op) -> "
                f"{res.cost_us:.2f} us ({res.speedup:.2f}x, target {st.get('target', '?')})"
                + (f"; roofline {roof:.2f} us" if roof else ""))
    rows.append(f"total        {st.get('seconds', 0):.2f} s")
    return "\n".join(rows)


def _optimize_and_report(graph, args: argparse.Namespace) -> int:
    from .optimize import optimize

    progress = Progress(getattr(args, "quiet", False))
    kw = dict(target=args.target, rules=args.rules or ["rules"], guards=not args.no_guards,
              time_limit_s=args.time_limit, node_limit=args.node_limit,
              iter_limit=args.iter_limit, progress=progress, level=args.level)
    try:
        res = optimize(graph, **kw)
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
    return EXIT_EQUIVALENT


def cmd_optimize(args: argparse.Namespace) -> int:
    """Optimize a program file (or a benchmark) and print the search and its result."""
    if (args.program is None) == (args.bench is None):
        raise MirageError("optimize: give either PROGRAM.py or --bench NAME")
    graph = (load_program(args.program) if args.program
             else _bench_module("programs").program(args.bench, args.batch))
    return _optimize_and_report(graph, args)


def cmd_check_rules(args: argparse.Namespace) -> int:
    """Check rule files for soundness and print the table."""
    from .check_rules import check_rules

    report = check_rules(args.paths, instances=args.instances, seed=args.seed)
    print(report)
    return EXIT_EQUIVALENT if report.ok else EXIT_NOT_EQUIVALENT


def cmd_targets(args: argparse.Namespace) -> int:
    """List the built-in hardware profiles."""
    from .cost import profiles_dir
    from .gpuprofile import GPUProfile

    for path in sorted(profiles_dir().glob("*.toml")):
        prof = GPUProfile.load(path)
        print(f"{path.stem:<8} {getattr(prof, 'description', '') or prof.name}  ({path})")
    return EXIT_EQUIVALENT


def cmd_demo(args: argparse.Namespace) -> int:
    """Optimize a benchmark (or verify its hand-rewritten form) and print the result."""
    from .verify import verify

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
    print(f"\nverifying ({args.trials} finite-field trials + float64 check, "
          f"seed {args.seed}) ...")
    result = verify(original, candidate, trials=args.trials, seed=args.seed)
    _print_result(result)
    return EXIT_EQUIVALENT if result.equivalent else EXIT_NOT_EQUIVALENT


def cmd_verify(args: argparse.Namespace) -> int:
    """Verify the programs of two files against each other."""
    from .verify import verify

    a, b = load_program(args.a), load_program(args.b)
    result = verify(a, b, trials=args.trials, seed=args.seed)
    print(f"{args.a} vs {args.b}:")
    _print_result(result, "  ")
    return EXIT_EQUIVALENT if result.equivalent else EXIT_NOT_EQUIVALENT


def cmd_bench_verify(args: argparse.Namespace) -> int:
    """The verification table of bench/verify_bench.py."""
    command = " ".join(["eqsat-mirage", *args.argv])
    return _bench_module("verify_bench").run(args, command)


def cmd_bench(args: argparse.Namespace) -> int:
    """The GPU timings table of bench/gpu_bench.py."""
    command = " ".join(["eqsat-mirage", *args.argv])
    return _bench_module("gpu_bench").run(args, command)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``eqsat-mirage`` and its subcommands."""
    parser = argparse.ArgumentParser(
        prog="eqsat-mirage",
        description="A superoptimizer for GPU tensor programs on equality saturation. "
                    "Exit status: 0 equivalent, 1 not equivalent, 2 error.")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    demo = sub.add_parser(
        "demo", help="print a benchmark, a rewritten equivalent form and the verdict",
        description="Print a benchmark program (default: gqa at batch size 1), a hand-rewritten "
                    "equivalent form of it and the verifier's verdict with its false-positive "
                    "bound and time. Exit 0 if equivalent, 1 if not.")
    demo.add_argument("--bench", default="gqa",
                      choices=BENCH_NAMES,
                      help="benchmark (default: gqa)")
    demo.add_argument("--batch", type=int, default=1, help="batch size (default: 1)")
    demo.add_argument("--trials", type=int, default=4, help="finite-field trials (default: 4)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    demo.add_argument("--rewritten", action="store_true",
                      help="verify the hand-rewritten form instead of optimizing")
    _search_options(demo)
    demo.set_defaults(func=cmd_demo)

    opt = sub.add_parser(
        "optimize", help="superoptimize a program file or a benchmark",
        description="Superoptimize PROGRAM.py (a Python file defining `program` or `build()`) "
                    "or a benchmark (--bench). Progress goes to stderr; the chosen program "
                    "and a summary table to stdout. Exit 0 on success, 2 on error.")
    opt.add_argument("program", nargs="?", metavar="PROGRAM.py", help="the program's file")
    opt.add_argument("--bench", default=None,
                     choices=BENCH_NAMES,
                     help="optimize a benchmark instead of a file")
    opt.add_argument("--batch", type=int, default=1, help="benchmark batch size (default: 1)")
    opt.add_argument("--emit", default=None, metavar="OUT.py",
                     help="write the chosen program as a Triton module (kernels + run launcher)")
    opt.add_argument("--emit-json", default=None, metavar="FILE",
                     help="write the chosen program (MuGraph JSON) to FILE")
    _search_options(opt)
    opt.set_defaults(func=cmd_optimize)

    chk = sub.add_parser(
        "check-rules", help="test rewrite-rule files for soundness",
        description="Instantiate every rule of the given .egg files or folders with random "
                    "shaped tensors and compare both sides with the verifier. Exit 0 if all "
                    "are sound, 1 if any is not, 2 on a malformed file.")
    chk.add_argument("paths", nargs="+", metavar="FILE", help="rule files or folders")
    chk.add_argument("--instances", type=int, default=3, help="instances per rule (default: 3)")
    chk.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    chk.set_defaults(func=cmd_check_rules)

    tg = sub.add_parser("targets", help="list the built-in hardware profiles",
                        description="List the GPU profiles in extract/ that --target accepts.")
    tg.set_defaults(func=cmd_targets)

    ver = sub.add_parser(
        "verify", help="decide whether the programs of two files are equivalent",
        description="Each FILE is a Python file defining a module-level `program` (an "
                    "em.Graph) or a function `build()` returning one. Exit 0 if equivalent, "
                    "1 if not, 2 on error.")
    ver.add_argument("a", metavar="A.py", help="the first program's file")
    ver.add_argument("b", metavar="B.py", help="the second program's file")
    ver.add_argument("--trials", type=int, default=4, help="finite-field trials (default: 4)")
    ver.add_argument("--seed", type=int, default=None,
                     help="random seed (default: fresh randomness)")
    ver.set_defaults(func=cmd_verify)

    bench = sub.add_parser(
        "bench-verify", help="verify every benchmark against its rewritten form (a table)",
        description="Verify each benchmark program against its hand-rewritten form and print "
                    "the table of verdicts, bounds and times (bench/verify_bench.py).")
    try:
        _bench_module("verify_bench").build_parser(bench)
    except MirageError:
        pass  # reported when the command runs
    bench.set_defaults(func=cmd_bench_verify)

    gpu = sub.add_parser(
        "bench", help="time every benchmark on a CUDA GPU (--gpu)",
        description="Time each benchmark's chosen program against torch eager, torch.compile "
                    "and (attention) scaled_dot_product_attention on a CUDA GPU "
                    "(bench/gpu_bench.py). Exit 2 without a GPU.")
    try:
        _bench_module("gpu_bench").build_parser(gpu)
    except MirageError:
        pass  # reported when the command runs
    gpu.set_defaults(func=cmd_bench)
    return parser


def _search_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="h100", help="hardware profile name or .toml path "
                   "(default: h100; see `eqsat-mirage targets`)")
    p.add_argument("--rules", action="append", default=None, metavar="FILE",
                   help="rule file or folder (repeatable; default: the built-in rules)")
    p.add_argument("--no-guards", action="store_true",
                   help="switch off the abstract-expression guards")
    p.add_argument("--time-limit", type=float, default=30.0,
                   help="seconds per saturation phase (default: 30)")
    p.add_argument("--node-limit", type=int, default=200_000,
                   help="tensor e-nodes per phase (default: 200000)")
    p.add_argument("--iter-limit", type=int, default=12,
                   help="iterations per phase (default: 12)")
    p.add_argument("--level", choices=("mugraph", "kernel"), default="mugraph",
                   help="mugraph: fused custom kernels (default); kernel: algebra only")
    p.add_argument("--quiet", action="store_true", help="no progress display")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``eqsat-mirage`` console script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    try:
        return args.func(args)
    except MirageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
