"""Decode prompts on a tiny local model with every method; print tokens per forward and agreement with AR.

    python -m scripts.demo [--models DIR] [--family qwen3] [--max-tokens 48]
"""

import argparse
import json
from pathlib import Path

from common.checkpoint import eos_token_ids, load
from common.decoder import Limits
from common.methods import make_decoder, parse_config
from common.runner import ReferenceRunner
from common.sampling import SamplingParams
from scripts.make_tiny_models import make_all

PROMPTS = ["def wrap(text, width=70):", "import heapq\n", "class Formatter:"]
METHODS = [
    ("ar", {}),
    ("jacobi", {"block_size": 8}),
    ("jacobi", {"block_size": 8, "num_blocks": 2, "pool_size": 4, "verification_size": 4}),
    ("diffusion_self", {"num_speculative_tokens": 8}),
    ("diffusion", {"block_size": 8, "confidence_threshold": 0.9}),
    ("wedlm", {"window": 8, "entropy_threshold": 0.4}),
]


def agreement(tokens: list[int], reference: list[int]) -> float:
    """Fraction of positions where `tokens` equals the greedy AR output."""
    same = sum(a == b for a, b in zip(tokens, reference, strict=False))
    return same / max(len(reference), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="out/tiny-models", help="where the tiny checkpoints are (built if absent)")
    parser.add_argument("--family", default="qwen3", choices=["qwen3", "qwen2", "llama"])
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    if not (Path(args.models) / args.family / "config.json").exists():
        make_all(args.models)
    model, tokenizer = load(Path(args.models) / args.family)
    limits = Limits(args.max_tokens, eos_token_ids(model, tokenizer))
    runner = ReferenceRunner(model)
    print(f"model: {args.family} tiny (random weights), {args.max_tokens} tokens per prompt, greedy\n")
    print(f"{'method':<62} {'tokens':>6} {'fwd':>5} {'tok/fwd':>8} {'p_cache':>8} {'= AR':>6}")
    reference: dict[str, list[int]] = {}
    for method, settings in METHODS:
        config = parse_config(method, settings, mask_token_id=model.config.mask_token_id)
        tokens = forwards = 0
        cache_rate = agree = 0.0
        for prompt in PROMPTS:
            result = runner.run(make_decoder(method, config, tokenizer.encode(prompt), SamplingParams(), limits))
            reference.setdefault(prompt, result.token_ids)
            tokens, forwards = tokens + len(result.token_ids), forwards + result.forwards
            cache_rate += result.p_cache / len(PROMPTS)
            agree += agreement(result.token_ids, reference[prompt]) / len(PROMPTS)
        label = f"{method} {json.dumps(settings, separators=(',', ':'))}" if settings else method
        print(f"{label:<62} {tokens:>6} {forwards:>5} {tokens / forwards:>8.2f} {cache_rate:>8.2f} {agree:>6.0%}")
    print(f"\n{PROMPTS[0]!r} -> {tokenizer.decode(reference[PROMPTS[0]])!r}")


if __name__ == "__main__":
    main()
