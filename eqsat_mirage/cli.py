"""The ``eqsat-mirage`` command line."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``eqsat-mirage`` console script."""
    parser = argparse.ArgumentParser(prog="eqsat-mirage", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("demo", help="verify the benchmark programs against rewritten forms")
    args = parser.parse_args(argv)
    if args.cmd == "demo":
        print("demo: not yet")
    return 0


if __name__ == "__main__":
    sys.exit(main())
