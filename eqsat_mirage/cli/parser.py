"""The argument parser of the ``eqsat-mirage`` command line (the commands are in main.py)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable

from ..ir.errors import MirageError

EXIT_STATUS = """exit status:
  0  success: equivalent, sound, or a verified program faster than one kernel per op
  1  not equivalent, unsound, or optimize found nothing (no verified program faster
     than one kernel per op)
  2  usage or input error (error: ... on stderr, naming the file and line)"""
BENCH_NAMES = ("gqa", "qknorm", "rmsnorm", "lora", "gatedmlp", "ntrans",  # bench/programs.py
               "gqa_safe", "qknorm_safe", "causal")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (``PROG: error: ...``) and exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(commands: dict[str, Callable], bench_module: Callable) -> argparse.ArgumentParser:
    """The argument parser of ``eqsat-mirage``; ``commands`` maps subcommand -> function.

    ``bench_module(name)`` imports a module of bench/ (its options join the bench commands).
    """
    parser = _Parser(
        prog="eqsat-mirage",
        description="A superoptimizer for GPU tensor programs on equality saturation.",
        epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    _demo_command(sub, commands)
    _optimize_command(sub, commands)
    _check_rules_command(sub, commands)
    _cache_command(sub, commands)
    _targets_command(sub, commands)
    _verify_command(sub, commands)
    _bench_command(sub, commands, bench_module)
    return parser


def _demo_command(sub, commands: dict[str, Callable]) -> None:
    """``demo``: optimize a benchmark and print the result (or verify its rewritten form)."""
    demo = sub.add_parser(
        "demo", help="optimize a benchmark and print the result (or, with --rewritten, verify "
                     "a hand-rewritten form)",
        description="Optimize a benchmark program (default: gqa at batch size 1) and print the "
                    "result: predicted time before and after, the verdict with its "
                    "false-positive bound, the chosen kernels (results are cached). With "
                    "--rewritten, print a hand-rewritten equivalent form instead and the "
                    "verifier's verdict on it.",
        epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_argument("--bench", default="gqa",
                      choices=BENCH_NAMES,
                      help="benchmark (default: gqa)")
    demo.add_argument("--batch", type=int, default=1, help="batch size (default: 1)")
    demo.add_argument("--trials", type=int, default=4, help="finite-field trials (default: 4)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    demo.add_argument("--rewritten", action="store_true",
                      help="verify the hand-rewritten form instead of optimizing")
    _search_options(demo)
    demo.set_defaults(func=commands["demo"])


def _optimize_command(sub, commands: dict[str, Callable]) -> None:
    """``optimize``: superoptimize program files or a benchmark."""
    opt = sub.add_parser(
        "optimize", help="superoptimize program files or a benchmark",
        description="Superoptimize PROGRAM.py (a Python file defining `program` or `build()`; "
                    "several files run in --jobs parallel processes) or a benchmark (--bench). "
                    "Progress goes to stderr; the chosen program and a summary table to stdout. "
                    "Results are cached: a repeated run returns at once.",
        epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    opt.add_argument("programs", nargs="*", metavar="PROGRAM.py", help="the programs' files")
    opt.add_argument("--jobs", "-j", type=int, default=1, metavar="N",
                     help="optimize several files in N worker processes (default: 1)")
    opt.add_argument("--bench", default=None,
                     choices=BENCH_NAMES,
                     help="optimize a benchmark instead of a file")
    opt.add_argument("--batch", type=int, default=1, help="benchmark batch size (default: 1)")
    opt.add_argument("--emit", default=None, metavar="OUT.py",
                     help="write the chosen program as a Triton module (kernels + run launcher)")
    opt.add_argument("--emit-json", default=None, metavar="FILE",
                     help="write the chosen program (MuGraph JSON) to FILE")
    opt.add_argument("--render", default=None, metavar="PIC.svg",
                     help="draw the input and the chosen program side by side (.svg, .png, "
                          ".pdf; graphviz if `dot` is installed, else matplotlib)")
    _search_options(opt)
    opt.set_defaults(func=commands["optimize"])


def _check_rules_command(sub, commands: dict[str, Callable]) -> None:
    """``check-rules``: test rewrite-rule files for soundness."""
    chk = sub.add_parser(
        "check-rules", help="test rewrite-rule files for soundness",
        description="Instantiate every rule of the given .egg files or folders with random "
                    "shaped tensors and compare both sides with the verifier. Exit 0 if all "
                    "are sound, 1 if any is not, 2 on a malformed file.")
    chk.add_argument("paths", nargs="+", metavar="FILE", help="rule files or folders")
    chk.add_argument("--instances", type=int, default=3, help="instances per rule (default: 3)")
    chk.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    chk.set_defaults(func=commands["check-rules"])


def _cache_command(sub, commands: dict[str, Callable]) -> None:
    """``cache``: list, clear or locate the results cache."""
    cache = sub.add_parser(
        "cache", help="list, clear or locate the results cache",
        description="The results cache of optimize/demo/bench: `list` prints its entries, "
                    "`clear` removes them, `path` prints the file ($EQSAT_MIRAGE_CACHE_DIR, "
                    "else $XDG_CACHE_HOME/eqsat-mirage, else ~/.cache/eqsat-mirage).",
        epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    cache.add_argument("action", choices=("list", "clear", "path"), help="what to do")
    cache.add_argument("--cache-dir", default=None, metavar="DIR",
                       help="the cache folder (default: see above)")
    cache.set_defaults(func=commands["cache"])


def _targets_command(sub, commands: dict[str, Callable]) -> None:
    """``targets``: list the built-in hardware profiles."""
    tg = sub.add_parser("targets", help="list the built-in hardware profiles",
                        description="List the GPU profiles in extract/ that --target accepts.")
    tg.set_defaults(func=commands["targets"])


def _verify_command(sub, commands: dict[str, Callable]) -> None:
    """``verify``: decide whether the programs of two files are equivalent."""
    ver = sub.add_parser(
        "verify", help="decide whether the programs of two files are equivalent",
        description="Each FILE is a Python file defining a module-level `program` (an "
                    "em.Graph or em.MuGraph) or a function `build()` returning one, or a "
                    "MuGraph JSON file (optimize --emit-json). Exit 0 if equivalent, "
                    "1 if not, 2 on error.")
    ver.add_argument("a", metavar="A.py", help="the first program's file (.py or .json)")
    ver.add_argument("b", metavar="B.py", help="the second program's file (.py or .json)")
    ver.add_argument("--trials", type=int, default=4,
                     help="finite-field trials, at least (default: 4)")
    ver.add_argument("--max-bound", type=float, default=1e-9,
                     help="largest false-positive bound that counts as equivalent; more "
                          "trials run until it holds, else inconclusive (default: 1e-9)")
    ver.add_argument("--seed", type=int, default=None,
                     help="random seed (default: fresh randomness)")
    ver.set_defaults(func=commands["verify"])


def _bench_command(sub, commands: dict[str, Callable], bench_module: Callable) -> None:
    """``bench-verify`` and ``bench``: the benchmark tables (their options from bench/)."""
    bench = sub.add_parser(
        "bench-verify", help="verify every benchmark against its rewritten form (a table)",
        description="Verify each benchmark program against its hand-rewritten form and print "
                    "the table of verdicts, bounds and times (bench/verify_bench.py).")
    try:
        bench_module("verify_bench").build_parser(bench)
    except MirageError:
        pass  # reported when the command runs
    bench.set_defaults(func=commands["bench-verify"])

    gpu = sub.add_parser(
        "bench", help="time every benchmark on a CUDA GPU (--gpu)",
        description="Time each benchmark's chosen program against torch eager, torch.compile "
                    "and (attention) scaled_dot_product_attention on a CUDA GPU "
                    "(bench/gpu_bench.py). Exit 2 without a GPU.")
    try:
        bench_module("gpu_bench").build_parser(gpu)
    except MirageError:
        pass  # reported when the command runs
    _cache_options(gpu)
    gpu.set_defaults(func=commands["bench"])


def _search_options(p: argparse.ArgumentParser) -> None:
    """The flags of the search options that have one, made from ``SearchOptions``' fields
    (the flag, its argparse keywords, the description and the default stated there)."""
    from ..pipeline.options import SearchOptions

    for f in dataclasses.fields(SearchOptions):
        flag = f.metadata.get("flag")
        if flag is None:
            continue
        cli = dict(f.metadata["cli"])
        # a repeatable flag starts empty (None: the option's default); the others hold it
        default = None if cli.get("action") == "append" else f.default
        shown = ", ".join(f.default) if isinstance(f.default, tuple) else f.default
        text = cli.pop("help", None) or f"{f.metadata['doc']} (default: {shown})"
        p.add_argument(flag, dest=f.name, default=default, help=text.replace("%", "%%"), **cli)
    p.add_argument("--quiet", action="store_true", help="no progress display")
    _cache_options(p)


def search_keywords(args: argparse.Namespace) -> dict:
    """The search options given on the command line, by option name (a flag left unset,
    or a repeatable one never given, keeps the option's default)."""
    from ..pipeline.options import SearchOptions

    return {f.name: getattr(args, f.name) for f in dataclasses.fields(SearchOptions)
            if f.metadata.get("flag") and getattr(args, f.name, None) is not None}


def _cache_options(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument("--no-cache", action="store_true",
                       help="search afresh and store nothing in the results cache")
    group.add_argument("--cache-dir", default=None, metavar="DIR",
                       help="results cache folder (default: $EQSAT_MIRAGE_CACHE_DIR, else "
                            "~/.cache/eqsat-mirage; see `eqsat-mirage cache path`)")
