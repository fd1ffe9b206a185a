"""The ``eqsat-mirage`` command line.

    eqsat-mirage demo [--bench NAME] [--batch B] [--trials T] [--seed S]
    eqsat-mirage verify A.py B.py [--trials T] [--seed S]
    eqsat-mirage bench-verify [--trials T] [--bench NAME] [--batch B] [--write FILE]

``demo`` prints a benchmark program, a hand-rewritten equivalent form and the
verifier's verdict on the pair. ``verify`` compares two programs, each a Python
file that defines a module-level ``program`` (an ``em.Graph``) or a function
``build()`` returning one. ``bench-verify`` prints the verification table of all
benchmarks (``bench/verify_bench.py``). Exit status: 0 equivalent, 1 not
equivalent, 2 error (a library error prints ``error: ...``, no traceback).
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
    if not isinstance(program, Graph) and not hasattr(program, "to_graph"):
        raise MirageError(f"{path}: {what} is a {type(program).__name__}, not an em.Graph")
    return program


def _print_result(result, indent: str = "") -> None:
    print(f"{indent}{result}")
    if result.equivalent:
        print(f"{indent}per-trial bound {result.per_trial_bound:.3g}, {result.trials} trials "
              f"-> false-positive bound {result.false_positive_bound:.3g} "
              f"(p = {result.p}, q = {result.q})")


def cmd_demo(args: argparse.Namespace) -> int:
    """Print a benchmark, its rewritten form and the verdict on the pair."""
    from .verify import verify

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
                      choices=("gqa", "qknorm", "rmsnorm", "lora", "gatedmlp", "ntrans"),
                      help="benchmark (default: gqa)")
    demo.add_argument("--batch", type=int, default=1, help="batch size (default: 1)")
    demo.add_argument("--trials", type=int, default=4, help="finite-field trials (default: 4)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    demo.set_defaults(func=cmd_demo)

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
    return parser


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
