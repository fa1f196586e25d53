"""The main job: vLLM's OpenAI server on a shipped tiny checkpoint, the same prompts decoded with AR and with a
parallel decoder on the same server setup, side by side: completions, tokens per forward, tokens/s, speedup.

Copies the shipped checkpoints (`scripts.trained_models`) into --models, then for AR and for the method in turn
starts the server, sends the prompts one at a time (batch 1) and all at once (batch 8) with the `openai` client,
greedy, and reads vLLM's own speculative-decoding metrics.

    python -m scripts.serve_demo [--models DIR] [--method jacobi] [--max-tokens 64]
"""

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import openai

from scripts.trained_models import copy
from scripts.vllm_server import metrics, vllm_server

# method -> (checkpoint trained for it, vLLM speculative config, forwards per verify step). Jacobi with n=8 and
# rejection recycling (the pool's newest candidate as the step's linear draft): on held-out prompts the tiny
# checkpoint accepts as much as with n=16 (1.95 tokens per forward) at half the verify width.
DEMOS = {
    "jacobi": ("jacobi_forcing", {"method": "jacobi", "block_size": 8, "pool_size": 4, "recycling": "linear"}, 1),
    "diffusion_self": ("nld", {"method": "diffusion_self", "num_speculative_tokens": 7}, 2),
}
PROMPTS = [
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
    tokens_per_forward: float = 1.0


def measure(client: openai.OpenAI, label: str, max_tokens: int, forwards_per_step: int) -> Run:
    def complete(prompt: str):
        return client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0)

    complete(PROMPTS[0])  # warm-up
    before = metrics(client)
    run = Run(label)
    start = time.perf_counter()
    answers = [complete(p) for p in PROMPTS]
    run.tokens_per_second[1] = sum(a.usage.completion_tokens for a in answers) / (time.perf_counter() - start)
    run.texts = [a.choices[0].text for a in answers]
    after = metrics(client)
    start = time.perf_counter()
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = list(pool.map(complete, PROMPTS))
    seconds = time.perf_counter() - start
    run.tokens_per_second[len(PROMPTS)] = sum(a.usage.completion_tokens for a in answers) / seconds

    def total(samples: dict[str, float], name: str) -> float:
        return sum(v for k, v in samples.items() if k.startswith(name))

    drafts = total(after, "vllm:spec_decode_num_drafts_total") - total(before, "vllm:spec_decode_num_drafts_total")
    accepted = (total(after, "vllm:spec_decode_num_accepted_tokens_total")
                - total(before, "vllm:spec_decode_num_accepted_tokens_total"))
    if drafts:
        run.tokens_per_forward = (1 + accepted / drafts) / forwards_per_step
    return run


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.serve_demo", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="out/trained-models", help="where the shipped checkpoints are copied")
    parser.add_argument("--method", choices=sorted(DEMOS), default="jacobi")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    checkpoint, spec, forwards_per_step = DEMOS[args.method]
    model = copy(Path(args.models))[checkpoint]
    runs = []
    for label, config in (("ar", None), (args.method, spec)):
        print(f"starting vLLM's OpenAI server on {model} with speculative config {config}", flush=True)
        with vllm_server(model, config, log_path=Path(args.models) / f"vllm-{label}.log") as client:
            runs.append(measure(client, label, args.max_tokens, forwards_per_step if config else 1))
    ar, method = runs
    for prompt, want, got in zip(PROMPTS, ar.texts, method.texts, strict=True):
        print(f"\n--- {prompt!r}\n{got}" + ("" if got == want else f"\n--- (AR said)\n{want}"))
    print(f"\n{len(PROMPTS)} prompts x {args.max_tokens} tokens, greedy, {checkpoint} checkpoint, vLLM on CPU")
    print(f"{'':<16} {'tok/fwd':>8} {'tok/s b=1':>10} {'tok/s b=8':>10} {'speedup b=1':>12} {'speedup b=8':>12}")
    for run in runs:
        speed = [run.tokens_per_second[b] / ar.tokens_per_second[b] for b in (1, len(PROMPTS))]
        print(f"{run.label:<16} {run.tokens_per_forward:>8.2f} {run.tokens_per_second[1]:>10.1f} "
              f"{run.tokens_per_second[len(PROMPTS)]:>10.1f} {speed[0]:>11.2f}x {speed[1]:>11.2f}x")
    same = sum(a == b for a, b in zip(ar.texts, method.texts, strict=True))
    print(f"{same}/{len(PROMPTS)} completions identical to AR")


if __name__ == "__main__":
    main()
