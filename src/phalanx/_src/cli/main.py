"""The `phalanx` command: one argparse subcommand per module.

Each subcommand lives in `phalanx._src.cli.<name>` and provides `HELP` (one line),
`configure(parser)` (adds its arguments) and `run(args) -> int` (the exit status). Modules are
imported when the parser is built, so they keep heavy imports (jax) inside `run`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# The subcommands, in the order `phalanx --help` lists them; add a name here and a module
# beside this one to add a subcommand.
SUBCOMMANDS = ("train", "report", "doctor", "launch")


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of `phalanx` with every subcommand configured."""
    parser = argparse.ArgumentParser(
        prog="phalanx",
        description="Synchronous data-parallel training on JAX with tf.distribute's model.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"phalanx._src.cli.{name}")
        sub = commands.add_parser(name, help=module.HELP, description=module.HELP)
        module.configure(sub)
        sub.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `phalanx` command line and return its exit status.

    Args:
      argv: the arguments after the program name; None reads `sys.argv[1:]`.

    Returns:
      The subcommand's exit status (0 on success).

    Example:
      >>> main(["doctor", "--json"])
      0
    """
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    return int(args._run(args))


if __name__ == "__main__":
    sys.exit(main())
