"""Decode prompts on tiny local models with every method; print tokens per forward and agreement with AR.

Trains two tiny checkpoints on standard-library sources first (about a minute each, cached in --models):
an NLD-style one (block diffusion + AR) for jacobi / diffusion_self / diffusion, and a WeDLM-style one for wedlm.

    python -m scripts.demo [--models DIR] [--steps 300] [--max-tokens 48]
"""

import argparse
import json
from pathlib import Path

from common.checkpoint import eos_token_ids, load, resolve_mask_token_id
from common.decoder import Limits
from common.draft_layout import resolve_dlm_type
from common.methods import make_decoder, parse_config
from common.runner import ReferenceRunner
from common.sampling import SamplingParams
from scripts.train_tiny_dlm import save, train

PROMPTS = ["def wrap(text, width=70):", "import heapq\n", "class Formatter:"]
METHODS = {
    "nld": [
        ("jacobi", {"block_size": 8}),
        ("jacobi", {"block_size": 8, "num_blocks": 2, "pool_size": 4, "verification_size": 4}),
        ("diffusion_self", {"num_speculative_tokens": 8}),
        ("diffusion", {"block_size": 8, "confidence_threshold": 0.9}),
        ("diffusion", {"block_size": 8, "confidence_threshold": 0.5}),
    ],
    "wedlm": [
        ("wedlm", {"window": 8, "entropy_threshold": 0.4, "distance_penalty": 0.02}),
        ("wedlm", {"window": 8, "entropy_threshold": 2.0, "distance_penalty": 0.02}),
    ],
}


def agreement(tokens: list[int], reference: list[int]) -> float:
    """Fraction of positions where `tokens` equals the greedy AR output."""
    same = sum(a == b for a, b in zip(tokens, reference, strict=False))
    return same / max(len(reference), 1)


def ensure_model(path: Path, objective: str, steps: int) -> Path:
    if not (path / "config.json").exists():
        print(f"training the {objective} tiny model ({steps} steps) into {path}", flush=True)
        save(*train(objective, steps), path, objective)
    return path


def report(path: Path, methods: list[tuple[str, dict]], max_tokens: int) -> None:
    model, tokenizer = load(path)
    mask_id = resolve_mask_token_id(model.config, tokenizer)
    limits = Limits(max_tokens, eos_token_ids(model, tokenizer))
    runner = ReferenceRunner(model)
    architecture = json.loads((path / "config.json").read_text())["architectures"][0]
    print(f"\n{path} ({architecture}), {len(PROMPTS)} prompts x {max_tokens} tokens, greedy")
    print(f"{'method':<72} {'tokens':>6} {'fwd':>5} {'tok/fwd':>8} {'p_cache':>8} {'= AR':>6}")
    reference: dict[str, list[int]] = {}
    for method, settings in [("ar", {}), *methods]:
        config = resolve_dlm_type(parse_config(method, settings, mask_token_id=mask_id), model.config)
        tokens = forwards = 0
        agree = cache_rate = 0.0
        for prompt in PROMPTS:
            result = runner.run(make_decoder(method, config, tokenizer.encode(prompt), SamplingParams(), limits))
            reference.setdefault(prompt, result.token_ids)
            tokens, forwards = tokens + len(result.token_ids), forwards + result.forwards
            cache_rate += result.p_cache / len(PROMPTS)
            agree += agreement(result.token_ids, reference[prompt]) / len(PROMPTS)
        label = f"{method} {json.dumps(settings, separators=(',', ':'))}" if settings else method
        print(f"{label:<72} {tokens:>6} {forwards:>5} {tokens / forwards:>8.2f} "
              f"{cache_rate:>8.2f} {agree:>6.0%}")
    print(f"  {PROMPTS[0]!r} -> {tokenizer.decode(reference[PROMPTS[0]])!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="out/demo-models", help="where the trained tiny checkpoints are cached")
    parser.add_argument("--steps", type=int, default=300, help="training steps per tiny model")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    for objective, methods in METHODS.items():
        report(ensure_model(Path(args.models) / objective, objective, args.steps), methods, args.max_tokens)


if __name__ == "__main__":
    main()
