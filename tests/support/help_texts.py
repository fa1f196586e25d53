"""Each command's `--help`, all in one process (`python -m tests.support.help_texts COMMAND...`, a JSON object of
command to exit status and output): a `python -m MODULE` runs as `__main__`, a `parallel-decoding SUB` through the
console script's entry point. One process imports torch once; a process per command cost 20-36 s each on CI's
2-core VM, 8 minutes for the 18 documented commands."""

import contextlib
import io
import json
import runpy
import sys
import traceback

from parallel_decoding.common.cli import main as console


def help_text(command: str) -> tuple[int, str]:
    """The exit status and standard output of `command --help`."""
    program, *words = command.split()
    out = io.StringIO()
    status = 0
    with contextlib.redirect_stdout(out):
        try:
            if program == "python":
                sys.argv = [words[1], "--help"]
                runpy.run_module(words[1], run_name="__main__", alter_sys=True)
            else:
                console([*words, "--help"])
        except SystemExit as exit_:
            status = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
        except Exception:  # a module or subcommand that is not there: its command fails, not the others
            status = 1
            out.write(traceback.format_exc())
    return status, out.getvalue()


if __name__ == "__main__":
    texts = {command: help_text(command) for command in sys.argv[1:]}
    sys.stdout.write(json.dumps(texts))
