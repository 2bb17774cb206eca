"""``python -m toolkernel.lint PATH… [--format text|json|sarif]``.

A stand-alone entry point; the ``toolkernel lint`` subcommand is the same thin shell
over :func:`toolkernel.lint.run_lint`.
"""

from __future__ import annotations

import argparse
import sys

from toolkernel.lint.report import path_argument, run_lint


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, lint, print the report and return the exit code."""
    parser = argparse.ArgumentParser(prog="toolkernel lint", description=__doc__)
    parser.add_argument("paths", nargs="+", type=path_argument, metavar="PATH")
    parser.add_argument("--format", choices=("text", "json", "sarif"), default="text")
    args = parser.parse_args(argv)
    report, code = run_lint(args.paths, args.format)
    sys.stdout.write(report)
    return code


if __name__ == "__main__":
    sys.exit(main())
