"""The tiny trained checkpoints' quality on held-out standard-library files: held-out bits per byte, and per method
preset, greedy, tokens per forward (every forward: draft, reveal, verify), agreement with the same checkpoint's greedy
AR output and the output's own bits per token read causally (greedy AR's is the least an output can have)."""

import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from parallel_decoding.common.checkpoint import load
from parallel_decoding.common.reference_setup import reference_setup
from parallel_decoding.common.sampling import SamplingParams
from scripts import corpus

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# (checkpoint, method, preset): the measurements docs/checkpoints.md's table and the floors test report.
PRESETS = [
    ("nld", "diffusion_self", "tiny-nld-self-spec.json"),
    ("nld", "diffusion_self_quadratic", "tiny-nld-quadratic.json"),
    ("nld", "diffusion", "tiny-nld-diffusion.json"),
    ("wedlm", "wedlm", "tiny-wedlm.json"),
    ("wedlm", "wedlm_spec", "tiny-wedlm-spec.json"),
    ("jacobi_forcing", "jacobi", "tiny-jacobi-forcing.json"),
    ("ar", "jacobi", "tiny-jacobi-forcing.json"),
]


@dataclass
class MethodScore:
    """A method's greedy outputs on the prompts, its forwards, and greedy AR's outputs and decision margins."""

    checkpoint: str
    method: str
    preset: str
    outputs: list[list[int]]
    forwards: int
    reference: list[list[int]]
    reference_margins: list[list[float]]
    bits_per_token: float = 0.0
    reference_bits_per_token: float = 0.0

    @property
    def tokens(self) -> int:
        return sum(map(len, self.outputs))

    @property
    def tokens_per_forward(self) -> float:
        return self.tokens / max(self.forwards, 1)

    @property
    def agreement(self) -> float:
        """Fraction of generated positions equal to greedy AR's."""
        same = sum(a == b for got, want in zip(self.outputs, self.reference, strict=True)
                   for a, b in zip(got, want, strict=False))
        return same / max(self.tokens, 1)

    def summary(self) -> dict:
        return {"checkpoint": self.checkpoint, "method": self.method, "preset": self.preset, "tokens": self.tokens,
                "forwards": self.forwards, "tokens_per_forward": self.tokens_per_forward,
                "agreement": self.agreement, "bits_per_token": self.bits_per_token,
                "ar_bits_per_token": self.reference_bits_per_token}


@torch.inference_mode()
def bits_per_byte(model: torch.nn.Module, tokenizer, seq_len: int = 256, max_files: int | None = None) -> float:
    """Held-out loss: total next-token loss over every held-out file, in bits, per byte of source."""
    nats, total_bytes = 0.0, 0
    device = next(model.parameters()).device
    for path in corpus.files(held_out=True)[:max_files]:
        text = path.read_text(encoding="utf-8", errors="ignore")
        ids = torch.tensor(tokenizer.encode(text))
        total_bytes += len(text.encode("utf-8"))
        for start in range(0, len(ids) - 1, seq_len):
            chunk = ids[start : start + seq_len + 1].to(device)
            logits = model(input_ids=chunk[None, :-1]).logits[0].float()
            nats += torch.nn.functional.cross_entropy(logits, chunk[1:], reduction="sum").item()
    return nats / math.log(2) / total_bytes


@torch.inference_mode()
def output_bits(model: torch.nn.Module, prompts: list[list[int]], outputs: list[list[int]]) -> float:
    """Bits per generated token of `outputs` after their prompts, read causally by `model`: what an approximate
    decoder's text costs in likelihood, next to greedy AR's."""
    nats, count = 0.0, 0
    device = next(model.parameters()).device
    for prompt, output in zip(prompts, outputs, strict=True):
        if not output:
            continue
        ids = torch.tensor(prompt + output, device=device)
        logits = model(input_ids=ids[None, :-1]).logits[0, len(prompt) - 1 :].float()
        nats += torch.nn.functional.cross_entropy(logits, ids[len(prompt) :], reduction="sum").item()
        count += len(output)
    return nats / math.log(2) / max(count, 1)


@cache
def greedy_ar(path: Path, prompts: tuple[str, ...], max_tokens: int, device: str
              ) -> tuple[list[list[int]], list[list[float]], float]:
    """Greedy AR's outputs, decision margins and bits per token on `prompts`, computed once per checkpoint for all
    its methods."""
    ar = reference_setup(path, "ar", device=device)
    limits = ar.limits(max_tokens)
    encoded = [ar.tokenizer.encode(prompt) for prompt in prompts]
    results = [ar.runner.run(ar.decoder(ids, SamplingParams(), limits)) for ids in encoded]
    outputs = [r.token_ids for r in results]
    return outputs, [r.margins for r in results], output_bits(ar.model, encoded, outputs)


def score(path: Path, method: str, preset: str, prompts: list[str], max_tokens: int, device: str = "cpu",
          settings: dict | None = None) -> MethodScore:
    """Greedy tokens per forward of `method` with `preset` (or `settings`) on `prompts`, and its agreement with
    greedy AR."""
    setup = reference_setup(path, method, settings or json.loads((CONFIGS / preset).read_text()), device=device)
    limits = setup.limits(max_tokens)
    reference, margins, reference_bits = greedy_ar(path, tuple(prompts), max_tokens, device)
    score = MethodScore(path.name, method, preset, [], 0, reference, margins,
                        reference_bits_per_token=reference_bits)
    encoded = [setup.tokenizer.encode(prompt) for prompt in prompts]
    for ids in encoded:
        got = setup.runner.run(setup.decoder(ids, SamplingParams(), limits))
        score.outputs.append(got.token_ids)
        score.forwards += got.forwards
    score.bits_per_token = output_bits(setup.model, encoded, score.outputs)
    return score


def run(models: str, prompts: int = 24, max_tokens: int = 64, device: str = "cpu") -> dict:
    """Bits per byte of each checkpoint in `models`, then each preset's scores, printed as they come."""
    root, texts = Path(models), corpus.prompts(prompts)
    report: dict = {"bits_per_byte": {}, "methods": []}
    for name in ("ar", "nld", "wedlm", "jacobi_forcing"):
        model, tokenizer = load(root / name, device=device)
        report["bits_per_byte"][name] = bpb = bits_per_byte(model, tokenizer)
        print(f"{name:<16} held-out {bpb:.3f} bits/byte", flush=True)
    print(f"\n{len(texts)} held-out prompts x {max_tokens} tokens, greedy")
    print(f"{'checkpoint':<16} {'method':<24} {'preset':<28} {'tok/fwd':>8} {'= AR':>6} {'bits/tok (AR)':>14}")
    for name, method, preset in PRESETS:
        result = score(root / name, method, preset, texts, max_tokens, device)
        report["methods"].append(result.summary())
        bits = f"{result.bits_per_token:.2f} ({result.reference_bits_per_token:.2f})"
        print(f"{name:<16} {method:<24} {preset:<28} {result.tokens_per_forward:>8.2f} {result.agreement:>6.0%} "
              f"{bits:>14}", flush=True)
    return report
