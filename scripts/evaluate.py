"""One entry point for evaluating methods, in the reference runner unless `--runner` says: `--suite` picks what.

Each suite is a module of scripts/evaluation/ whose `run` parameters are the flags it reads, with its defaults:

    python -m scripts.evaluate --models DIR [--prompts 24] [--max-tokens 64] [--device cpu] [--json OUT]
    python -m scripts.evaluate --suite huginn --model DIR [--num-steps 32] [--prompts 8] [--max-tokens 48] \\
        [--json out/huginn.json] [--png out/huginn.png]
    python -m scripts.evaluate --suite assd --model DIR [--lengths 128 512] [--samples 4] [--k 5] \\
        [--temperature 1.0] [--json out/assd.json] [--png out/assd.png]
    python -m scripts.evaluate --suite recycling [--runner reference] [--model DIR] [--json OUT]
    .venv-sglang/bin/python -m scripts.evaluate --suite recycling --runner sglang [--model DIR]
    python -m scripts.evaluate --suite structured [--model DIR] [--prompts 40] [--device cpu] [--json OUT]
    python -m scripts.evaluate --suite planner [--models DIR] [--max-tokens 64] [--json OUT]
"""

import argparse
import inspect
import json
from pathlib import Path
from types import ModuleType
from typing import Any

from scripts.evaluation import assd, huginn, planner, quality, recycling, structured

SUITES = {"quality": quality, "huginn": huginn, "assd": assd, "recycling": recycling, "structured": structured,
          "planner": planner}
REQUIRED = inspect.Parameter.empty


def reads(suite: ModuleType) -> dict[str, Any]:
    """The flags `suite` reads, each with its default: its `run`'s parameters, `--json`, and `--png` if it plots."""
    flags = {name: p.default for name, p in inspect.signature(suite.run).parameters.items()}
    return {**flags, "json": None, **({"png": None} if hasattr(suite, "plot") else {})}


def readers(flag: str) -> str:
    """Which suites read `flag`, with their defaults, for its help: `huginn: 32, assd: required`."""
    notes = []
    for name, suite in SUITES.items():
        if flag in (flags := reads(suite)):
            default = flags[flag]
            if isinstance(default, tuple):
                default = " ".join(map(str, default))
            notes.append(name if default is None else f"{name}: {'required' if default is REQUIRED else default}")
    return ", ".join(notes)


def parser() -> argparse.ArgumentParser:
    """Every suite's flags in one parser, each flag's help naming the suites that read it."""
    parser = argparse.ArgumentParser(prog="python -m scripts.evaluate", description=__doc__.splitlines()[0],
                                     epilog="In parentheses: the suites that read a flag, with their defaults; a flag "
                                            "the chosen suite does not read is refused.")
    parser.add_argument("--suite", choices=SUITES, default="quality",
                        help="quality: the tiny checkpoints' tokens per forward, agreement with AR and bits per token; "
                             "huginn: Huginn's samplers' sequential core passes per token; assd: ASSD's model calls "
                             "against sequential any-order decoding; recycling: Jacobi's tokens per forward with and "
                             "without rejection recycling; structured: each method with and without structured-output "
                             "constraints on the real model; planner: the width planner against the fixed width "
                             "under fixed cost models, in the reference runner (default: %(default)s)")
    for flag, text, options in [
        ("models", "a directory holding ar/ nld/ wedlm/ jacobi_forcing/", {"metavar": "DIR"}),
        ("model", "a checkpoint: a Raven for huginn, an XLNet AS-ARM for assd, any for recycling, which without it "
                  "builds the cyclic tiny model, a chat model with a draft adapter (or a Raven, "
                  "for Huginn's samplers) for structured (default: SmolLM2)", {"metavar": "DIR"}),
        ("prompts", "how many held-out prompts", {"type": int, "metavar": "N"}),
        ("max_tokens", "tokens generated per prompt", {"type": int, "metavar": "N"}),
        ("device", "torch device", {}),
        ("num_steps", "recurrences per token (r)", {"type": int, "metavar": "R"}),
        ("lengths", "sequence lengths", {"type": int, "nargs": "+", "metavar": "N"}),
        ("samples", "held-out windows per length and task", {"type": int, "metavar": "N"}),
        ("k", "ASSD's draft length", {"type": int}),
        ("temperature", "sampling temperature", {"type": float, "metavar": "T"}),
        ("runner", "where Jacobi runs: the reference runner, vLLM offline or SGLang's server (from .venv-sglang)",
         {"choices": sorted(recycling.RUNNERS)}),
        ("json", "write the report here", {"metavar": "OUT"}),
        ("png", "plot the report here", {"metavar": "OUT"}),
    ]:
        parser.add_argument("--" + flag.replace("_", "-"), help=f"{text} ({readers(flag)})", **options)
    return parser


def main() -> None:
    cli = parser()
    given = {name: value for name, value in vars(cli.parse_args()).items() if value is not None}
    name = given.pop("suite")
    suite, flags = SUITES[name], reads(SUITES[name])
    if stray := [f"--{flag.replace('_', '-')}" for flag in given if flag not in flags]:
        cli.error(f"--suite {name} does not read {', '.join(stray)}")
    if missing := [f"--{flag.replace('_', '-')}" for flag, default in flags.items()
                   if default is REQUIRED and flag not in given]:
        cli.error(f"--suite {name} needs {', '.join(missing)}")
    options = {**flags, **given}
    out, png = options.pop("json"), options.pop("png", None)
    report = suite.run(**options)
    if out:
        made(out).write_text(json.dumps(report, indent=1) + "\n")
    if png:
        suite.plot(report, str(made(png)))


def made(path: str) -> Path:
    """`path`, its folder created."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return Path(path)


if __name__ == "__main__":
    main()
