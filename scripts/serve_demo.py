"""The main job: vLLM's OpenAI server on SmolLM2-135M-Instruct (the real model, `scripts.smollm2`), the same chat
prompts answered with AR, with a parallel decoder and with vLLM's own `ngram` at the same width on the same server
setup, side by side: answers, tokens per forward, tokens/s, speedup over AR at batch 1 and batch 8. A second AR
server (`ar-again`) is measured as the others are: its speedup is AR against itself, how far this machine's pace
moves a ratio (on a 2-core VM, 0.95-1.05x at batch 8, docs/benchmarks.md), so a speedup is read against it.

Fetches and converts the model once (`scripts.smollm2`), starts the four servers (bf16) and keeps them up at once,
then in rounds over them, each round in a rotated order, sends the chat prompts through the chat completions
endpoint one at a time (batch 1, three rounds) and all at once (batch 8, seven rounds) with the `openai` client,
greedy: each server's tokens/s is the median of its rounds, and its speedup the median of its rounds' ratios to AR's
in the same round, as the machine's pace drifts over minutes (within a round the servers run seconds apart). Reads
vLLM's own speculative-decoding metrics. `--model tiny` serves a shipped tiny checkpoint trained for the method
instead (`scripts.trained_models`, plain-text prompts).

    python -m scripts.serve_demo [--method diffusion_self] [--model smollm2|tiny] [--max-tokens 96]
"""

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import openai

from scripts import chat_prompts, smollm2
from scripts.trained_models import copy
from scripts.vllm_server import CPU_ARGS, metrics, vllm_server

# On SmolLM2: method -> (vLLM speculative config, forwards per verify step). `diffusion_self` drafts 8 tokens with the
# shipped draft adapter (`configs/smollm2-self-spec.json`, `scripts.train_draft_adapter`; its quadratic mode accepts
# less per step and costs more per forward in vLLM on CPU, docs/benchmarks.md); `jacobi` verifies 8 with recycling.
REAL = {
    "diffusion_self": ({"method": "diffusion_self", "num_speculative_tokens": 8, "draft_adapter": "draft_lora"}, 2),
    "jacobi": ({"method": "jacobi", "block_size": 8, "pool_size": 4, "recycling": "linear"}, 1),
}
REAL_ARGS = ["--dtype", "bfloat16", "--enforce-eager", "--max-model-len", "1024", "--kv-cache-memory-bytes",
             str(256 << 20)]
# On the tiny checkpoints: method -> (checkpoint trained for it, vLLM speculative config, forwards per verify step).
# Jacobi with n=8 and rejection recycling: on held-out prompts the tiny checkpoint accepts as much as with n=16 (1.95
# tokens per forward) at half the verify width.
TINY = {
    "jacobi": ("jacobi_forcing", {"method": "jacobi", "block_size": 8, "pool_size": 4, "recycling": "linear"}, 1),
    "diffusion_self": ("nld", {"method": "diffusion_self", "num_speculative_tokens": 7}, 2),
}
TINY_PROMPTS = [
    "def wrap(text, width=70):",
    "import heapq",
    "class Formatter:",
    "    def __init__(self, ",
    "def bisect_left(a, x, lo=0, hi=None):",
    "for line in lines:",
    "    return ''.join(",
    "if __name__ == '__main__':",
]


@dataclass
class Run:
    """One server's answers and timings."""

    label: str
    texts: list[str] = field(default_factory=list)
    tokens_per_second: dict[int, float] = field(default_factory=dict)
    rounds: dict[int, list[float]] = field(default_factory=dict)  # tokens/s of each round, per batch size
    tokens_per_forward: float = 1.0  # at batch 1
    drafting: dict[int, float] = field(default_factory=dict)  # share of request steps that drafted, per batch size


def answer(response) -> str:
    """The text of a completion or a chat completion."""
    choice = response.choices[0]
    return choice.message.content if hasattr(choice, "message") else choice.text


# Rounds over the servers, in turn, per batch: batch 8's rounds take seconds and this VM's pace moves by 10-30% over a
# minute (the main job's batch 8 on SmolLM2, 2026-12-01: one server's rounds from 100 to 150 tok/s), so it gets more.
ROUNDS, BATCH_ROUNDS = 3, 7


def speedup(run: Run, ar: Run, size: int) -> float:
    """The median of a run's rounds' ratios to AR's rounds at `size` (each pair seconds apart)."""
    return statistics.median(r / a for r, a in zip(run.rounds[size], ar.rounds[size], strict=True))


@dataclass
class Server:
    """A running server's client, the run it fills, and the forwards a drafting step of its method runs (for tokens
    per forward)."""

    client: openai.OpenAI
    run: Run
    forwards_per_step: int  # forwards of a step that drafted (a draft forward of its own: 2)


def measure(servers: list[Server], prompts: list, max_tokens: int) -> None:
    """Every server's answers and tokens/s at batch 1 (the prompts one at a time) and batch len(prompts) (all at
    once): `ROUNDS` and `BATCH_ROUNDS` rounds over the servers up at once, each round in a rotated order, so that what
    slows the machine for a while slows each alike; prompts are chats (message lists) or texts."""

    def complete(client, prompt):
        if isinstance(prompt, str):
            return client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0)
        return client.chat.completions.create(model="tiny", messages=prompt, max_tokens=max_tokens, temperature=0)

    for server in servers:
        complete(server.client, prompts[0])  # warm-up
    with ThreadPoolExecutor(len(prompts)) as pool:
        batches = {1: lambda client: [complete(client, p) for p in prompts],
                   len(prompts): lambda client: list(pool.map(lambda p: complete(client, p), prompts))}
        for size, answer_all in batches.items():
            before = [metrics(server.client) for server in servers]
            speeds: list[list[float]] = [[] for _ in servers]
            tokens = [0 for _ in servers]
            for round_ in range(ROUNDS if size == 1 else BATCH_ROUNDS):
                for i in [(round_ + k) % len(servers) for k in range(len(servers))]:
                    start = time.perf_counter()
                    answers = answer_all(servers[i].client)
                    seconds = time.perf_counter() - start
                    produced = sum(a.usage.completion_tokens for a in answers)
                    speeds[i].append(produced / seconds)
                    tokens[i] += produced
                    if size == 1 and round_ == 0:
                        servers[i].run.texts = [answer(a) for a in answers]
            for server, was, speed, produced in zip(servers, before, speeds, tokens, strict=True):
                server.run.tokens_per_second[size] = statistics.median(speed)
                server.run.rounds[size] = speed
                now = metrics(server.client)
                drafts, accepted = (counted(now, name) - counted(was, name) for name in (
                    "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_total"))
                # Every step of a request is one target forward yielding 1 + accepted tokens; a step that drafted
                # also ran forwards_per_step - 1 draft forwards (none when the width planner made it a plain AR step).
                steps = produced - accepted
                server.run.drafting[size] = drafts / steps
                if size == 1:
                    server.run.tokens_per_forward = produced / (steps + drafts * (server.forwards_per_step - 1))


def counted(samples: dict[str, float], name: str) -> float:
    """A counter's total over its labels."""
    return sum(v for k, v in samples.items() if k.startswith(name))


def ngram_peer(spec: dict) -> dict:
    """vLLM's own `ngram` drafting as many tokens per step as the method verifies."""
    width = spec.get("num_speculative_tokens") or spec.get("block_size", 8)
    return {"method": "ngram", "num_speculative_tokens": width, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.serve_demo", description=__doc__.splitlines()[0])
    parser.add_argument("--method", choices=sorted(REAL), default="diffusion_self")
    parser.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--models", default="out/trained-models", help="where the shipped tiny checkpoints are copied")
    parser.add_argument("--max-tokens", type=int, default=None, help="default 96 (smollm2), 64 (tiny)")
    args = parser.parse_args()
    if args.model == "smollm2":
        model, (spec, forwards_per_step) = smollm2.ensure(), REAL[args.method]
        prompts = [chat_prompts.messages(p) for p in chat_prompts.sample("heldout", 8)]
        server_args, max_tokens, logs = REAL_ARGS, args.max_tokens or 96, model.parent
    else:
        checkpoint, spec, forwards_per_step = TINY[args.method]
        model = copy(Path(args.models))[checkpoint]
        prompts, server_args, max_tokens, logs = TINY_PROMPTS, CPU_ARGS, args.max_tokens or 64, Path(args.models)
    servers = []
    with ExitStack() as stack:
        for label, config, forwards in (("ar", None, 1), ("ar-again", None, 1), (args.method, spec, forwards_per_step),
                                        (f"ngram-{ngram_peer(spec)['num_speculative_tokens']}", ngram_peer(spec), 1)):
            print(f"starting vLLM's OpenAI server on {model} with speculative config {config}", flush=True)
            client = stack.enter_context(vllm_server(model, config, extra_args=server_args,
                                                     log_path=logs / f"vllm-{label}.log"))
            servers.append(Server(client, Run(label), forwards))
        measure(servers, prompts, max_tokens)
    runs = [server.run for server in servers]
    ar, again, method = runs[:3]
    for prompt, want, got in zip(prompts, ar.texts, method.texts, strict=True):
        shown = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        print(f"\n--- {shown!r}\n{got}" + ("" if got == want else f"\n--- (AR said)\n{want}"))
    print(f"\n{len(prompts)} prompts x {max_tokens} tokens, greedy, {Path(model).name}, vLLM on CPU")
    print(f"{'':<16} {'tok/fwd':>8} {'tok/s b=1':>10} {'tok/s b=8':>10} {'speedup b=1':>12} {'speedup b=8':>12} "
          f"{'drafted b=1':>12} {'drafted b=8':>12}")
    for run in runs:
        sizes = (1, len(prompts))
        speed = [speedup(run, ar, b) for b in sizes]
        print(f"{run.label:<16} {run.tokens_per_forward:>8.2f} {run.tokens_per_second[1]:>10.1f} "
              f"{run.tokens_per_second[len(prompts)]:>10.1f} {speed[0]:>11.2f}x {speed[1]:>11.2f}x "
              + " ".join(f"{run.drafting[b]:>12.0%}" for b in sizes))
    print("ar-again: the same AR server once more, its speedup AR against itself: how far this machine's pace moves "
          "a ratio over these rounds")
    print("drafted: the share of a request's steps that forwarded drafts (`diffusion_self` chooses per step by the "
          "measured cost of a row and its acceptance so far, docs/adaptive-widths.md; the rest are plain AR steps)")
    for run in runs[1:]:
        same = sum(a == b for a, b in zip(ar.texts, run.texts, strict=True))
        print(f"{same}/{len(prompts)} {run.label} answers identical to AR's" + (
            " (in bf16 a verify-width forward rounds differently from AR's one-row one: answers may part at a "
            "near-tie, docs/smollm2.md)" if args.model == "smollm2" and run is not again else ""))


if __name__ == "__main__":
    main()
