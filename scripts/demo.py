"""Decode prompts with every method on the checkpoint trained for it; print tokens per forward and agreement with AR.

Copies the shipped tiny checkpoints (`scripts.trained_models`) into --models first.

    python -m scripts.demo [--models DIR] [--max-tokens 48]
"""

import argparse
import json
from pathlib import Path

from parallel_decoding.common.reference_setup import reference_setup
from parallel_decoding.common.sampling import SamplingParams
from scripts.trained_models import copy

PROMPTS = ["def wrap(text, width=70):", "import heapq\n", "class Formatter:"]
CONFIGS = Path(__file__).resolve().parent.parent / "configs"
METHODS = {
    "nld": [
        ("diffusion_self", "tiny-nld-self-spec.json"),
        ("diffusion_self_quadratic", "tiny-nld-quadratic.json"),
        ("diffusion", "tiny-nld-diffusion.json"),
    ],
    "wedlm": [("wedlm", "tiny-wedlm.json")],
    "jacobi_forcing": [("jacobi", "tiny-jacobi-forcing.json")],
    "ar": [("jacobi", "tiny-jacobi-forcing.json")],
}


def agreement(tokens: list[int], reference: list[int]) -> float:
    """Fraction of positions where `tokens` equals the greedy AR output."""
    same = sum(a == b for a, b in zip(tokens, reference, strict=False))
    return same / max(len(reference), 1)


def report(path: Path, methods: list[tuple[str, str]], max_tokens: int) -> None:
    architecture = json.loads((path / "config.json").read_text())["architectures"][0]
    print(f"\n{path} ({architecture}), {len(PROMPTS)} prompts x {max_tokens} tokens, greedy")
    print(f"{'method':<96} {'tokens':>6} {'fwd':>5} {'tok/fwd':>8} {'p_cache':>8} {'= AR':>6}")
    reference: dict[str, list[int]] = {}
    for method, preset in [("ar", None), *methods]:
        settings = json.loads((CONFIGS / preset).read_text()) if preset else {}
        setup = reference_setup(path, method, settings)
        tokenizer, limits = setup.tokenizer, setup.limits(max_tokens)
        tokens = forwards = 0
        agree = cache_rate = 0.0
        for prompt in PROMPTS:
            result = setup.runner.run(setup.decoder(tokenizer.encode(prompt), SamplingParams(), limits))
            reference.setdefault(prompt, result.token_ids)
            tokens, forwards = tokens + len(result.token_ids), forwards + result.forwards
            cache_rate += result.p_cache / len(PROMPTS)
            agree += agreement(result.token_ids, reference[prompt]) / len(PROMPTS)
        label = f"{method} {json.dumps(settings, separators=(',', ':'))}" if settings else method
        label = label.replace('"draft_adapter":"linear_spec_lora"', "lora")
        print(f"{label:<96} {tokens:>6} {forwards:>5} {tokens / forwards:>8.2f} "
              f"{cache_rate:>8.2f} {agree:>6.0%}")
    print(f"  {PROMPTS[0]!r} -> {tokenizer.decode(reference[PROMPTS[0]])!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="out/trained-models", help="where the shipped checkpoints are copied")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    paths = copy(Path(args.models))
    for name, methods in METHODS.items():
        report(paths[name], methods, args.max_tokens)


if __name__ == "__main__":
    main()
