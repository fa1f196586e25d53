"""The `parallel-decoding` command: the package's command-line tools as subcommands.

    parallel-decoding generate --model DIR --method jacobi --prompts-file prompts.txt --json out.json
    parallel-decoding assd-server --model DIR --port 8000
"""

import importlib
import sys

# Subcommand -> the module whose `main(argv)` runs it.
SUBCOMMANDS = {
    "generate": "parallel_decoding.common.generate",
    "assd-server": "parallel_decoding.common.assd.server",
}


def main(argv: list[str] | None = None) -> None:
    """Run the subcommand `argv[0]` with the rest of `argv`."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in SUBCOMMANDS:
        names = ", ".join(SUBCOMMANDS)
        print(f"usage: parallel-decoding {{{names}}} [--help] ...", file=sys.stderr)
        raise SystemExit(0 if args and args[0] in {"-h", "--help"} else 2)
    importlib.import_module(SUBCOMMANDS[args[0]]).main(args[1:])
