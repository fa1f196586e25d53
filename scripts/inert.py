"""Installed but not selected, the plugin changes nothing: the same engine's OpenAI server, plain AR, with the
plugin loaded and with it left out (the engine's plugin whitelist names every other plugin), side by side in one
run, taking turns. Both must give identical completions; their tokens/s are reported per turn.

    python -m scripts.inert --engine vllm [--rounds 3] [--json FILE]
    .venv-sglang/bin/python -m scripts.inert --engine sglang

Exits with status 1 when the completions differ.
"""

import argparse
import json
import os
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib.metadata import entry_points
from pathlib import Path

from scripts.corpus import prompts as corpus_prompts
from scripts.server_process import ServerClient
from scripts.trained_models import copy

# engine -> (its general plugin group, the environment variable that whitelists plugins, our entry point's name)
PLUGIN_GROUPS = {"vllm": ("vllm.general_plugins", "VLLM_PLUGINS"), "sglang": ("sglang.srt.plugins", "SGLANG_PLUGINS")}
OURS = "parallel_decoding"


@dataclass
class Comparison:
    engine: str
    prompts: int
    max_tokens: int
    identical: bool = True
    tokens_per_second: dict[str, list[float]] = field(default_factory=lambda: {"with": [], "without": []})

    @property
    def ratio(self) -> float:
        """Median tokens/s with the plugin over median without."""
        return statistics.median(self.tokens_per_second["with"]) / statistics.median(self.tokens_per_second["without"])


@contextmanager
def whitelisted(engine: str, with_plugin: bool) -> Iterator[None]:
    """The engine's plugin whitelist (an environment variable servers started meanwhile inherit): unset with the
    plugin, every plugin of the group but ours without it."""
    group, variable = PLUGIN_GROUPS[engine]
    saved = os.environ.get(variable)
    if with_plugin:
        os.environ.pop(variable, None)
    else:
        os.environ[variable] = ",".join(e.name for e in entry_points(group=group) if e.name != OURS) or "none"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = saved


@contextmanager
def server(engine: str, model: Path, with_plugin: bool) -> Iterator[ServerClient]:
    """The engine's plain server, with or without the plugin."""
    if engine == "vllm":
        from scripts.vllm_server import vllm_server as start
    else:
        from scripts.sglang_server import sglang_server as start
    with whitelisted(engine, with_plugin), start(model, None) as client:
        yield client


def answers(client: ServerClient, prompts: list[str], max_tokens: int) -> tuple[list[str], float]:
    """Greedy completions of all prompts at once, and the completion tokens per second."""
    def complete(prompt: str):
        return client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0)

    complete(prompts[0])  # warm-up
    start = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        outs = list(pool.map(complete, prompts))
    elapsed = time.perf_counter() - start
    return [o.choices[0].text for o in outs], sum(o.usage.completion_tokens for o in outs) / elapsed


def compare(engine: str, model: Path, rounds: int = 3, count: int = 16, max_tokens: int = 64) -> Comparison:
    """`rounds` turns of the server with, then without the plugin, on the same prompts."""
    prompts = corpus_prompts(count)
    result = Comparison(engine, count, max_tokens)
    reference = None
    for _ in range(rounds):
        for label, with_plugin in (("with", True), ("without", False)):
            with server(engine, model, with_plugin) as client:
                texts, speed = answers(client, prompts, max_tokens)
            reference = texts if reference is None else reference
            result.identical &= texts == reference
            result.tokens_per_second[label].append(round(speed, 1))
            print(f"{label:>7} the plugin: {speed:7.1f} tokens/s, {'same' if texts == reference else 'DIFFERENT'}",
                  flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=sorted(PLUGIN_GROUPS), required=True)
    parser.add_argument("--models", type=Path, default=Path("out/trained-models"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path, help="write the comparison here")
    args = parser.parse_args()
    result = compare(args.engine, copy(args.models)["ar"], args.rounds, args.prompts, args.max_tokens)
    summary = {**asdict(result), "ratio": round(result.ratio, 3)}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    raise SystemExit(0 if result.identical else 1)


if __name__ == "__main__":
    main()
