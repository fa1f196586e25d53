"""Huginn's samplers on a recurrent-depth checkpoint, greedy, held-out prompts: sequential core passes per token (what
sets latency on a GPU), tokens/s here and agreement with `ar`, and the latent's relative change per recurrence."""

import dataclasses
import time

import torch
from tqdm import tqdm
from transformers import PreTrainedTokenizerFast

from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.huginn.config import HuginnConfig
from parallel_decoding.common.huginn.decoder import relative_change
from parallel_decoding.common.huginn.reference import generate
from parallel_decoding.common.models.raven import RavenForCausalLM
from parallel_decoding.common.sampling import SamplingParams
from scripts import corpus


def samplers(num_steps: int) -> dict[str, HuginnConfig]:
    """`ar` at r = num_steps (on each cache) and the other samplers with the paper's defaults (`speculative` on the
    `full` cache, where it is lossless; agreement is with `ar` on the sampler's cache)."""
    return {
        "ar": HuginnConfig(num_steps=num_steps),
        "ar (full cache)": HuginnConfig(num_steps=num_steps, cache_lookup_strategy="full"),
        "adaptive": HuginnConfig(sampler="adaptive", num_steps=num_steps),
        "speculative": HuginnConfig(sampler="speculative", num_steps=num_steps, draft_steps=max(num_steps // 4, 1),
                                    cache_lookup_strategy="full"),
        "wavefront": HuginnConfig(sampler="wavefront", num_steps=num_steps),
    }


def convergence(model: RavenForCausalLM, prompts: list[list[int]], recurrences: int) -> list[float]:
    """Mean relative change of the latent at each recurrence, over every position of the prompts."""
    curve = torch.zeros(recurrences)
    with torch.inference_mode():
        for ids in prompts:
            positions = torch.arange(len(ids))
            e = model.embed(torch.tensor(ids), positions, None)
            generator = torch.Generator().manual_seed(0)
            z = torch.stack([model.initial_latent(generator) for _ in ids])
            for t in range(recurrences):
                new = model.recur(z, e, positions, None, t)
                curve[t] += sum(relative_change(new[i], z[i]) for i in range(len(ids))) / len(ids)
                z = new
    return (curve / len(prompts)).tolist()


def run(model: str, num_steps: int = 32, prompts: int = 8, max_tokens: int = 48) -> dict:
    """Every sampler of `samplers(num_steps)` on `prompts` held-out prompts, and the convergence curve; printed."""
    raven = RavenForCausalLM.from_pretrained(model)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model)
    encoded = [tokenizer.encode(p) for p in corpus.prompts(prompts)]
    limits = Limits(max_tokens=max_tokens)
    report: dict = {"model": str(model), "num_steps": num_steps, "prompts": len(encoded),
                    "max_tokens": max_tokens, "convergence": convergence(raven, encoded, 2 * num_steps),
                    "samplers": {}}
    outputs: dict[str, list[list[int]]] = {}
    for name, config in tqdm(samplers(num_steps).items(), desc="samplers"):
        start, passes, tokens = time.perf_counter(), 0, 0
        outputs[name] = []
        for i, ids in enumerate(encoded):
            result = generate(raven, ids, config, SamplingParams(seed=i), limits)
            outputs[name].append(result.token_ids)
            passes, tokens = passes + result.core_passes, tokens + len(result.token_ids)
        seconds = time.perf_counter() - start
        reference = "ar (full cache)" if config.cache_lookup_strategy == "full" else "ar"
        pairs = zip(outputs[name], outputs[reference], strict=True)
        same = sum(a == b for got, ar in pairs for a, b in zip(got, ar, strict=False))
        report["samplers"][name] = {
            "config": dataclasses.asdict(config), "core_passes_per_token": passes / tokens,
            "tokens_per_second": tokens / seconds, "agreement_with_ar": same / tokens,
            "passes_saved_vs_ar": None}
    ar = report["samplers"]["ar"]["core_passes_per_token"]
    for row in report["samplers"].values():
        row["passes_saved_vs_ar"] = ar / row["core_passes_per_token"]
    print(f"{'sampler':<16} {'passes/token':>12} {'x fewer':>8} {'tok/s':>7} {'= ar':>6}")
    for name, row in report["samplers"].items():
        print(f"{name:<16} {row['core_passes_per_token']:>12.2f} {row['passes_saved_vs_ar']:>8.2f} "
              f"{row['tokens_per_second']:>7.1f} {row['agreement_with_ar']:>6.0%}")
    return report


def plot(report: dict, path: str) -> None:
    """The convergence curve beside each sampler's core passes per token and agreement."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    curve = report["convergence"]
    left.semilogy(range(1, len(curve) + 1), curve)
    left.axvline(report["num_steps"], color="grey", linestyle=":")
    left.set(xlabel="recurrence", ylabel="relative latent change", title="latent convergence")
    names = list(report["samplers"])
    rows = [report["samplers"][n] for n in names]
    right.bar(names, [r["core_passes_per_token"] for r in rows])
    for i, r in enumerate(rows):
        right.text(i, r["core_passes_per_token"], f"{r['agreement_with_ar']:.0%} = ar", ha="center", va="bottom")
    right.set(ylabel="sequential core passes per token", title=f"samplers, r = {report['num_steps']}")
    fig.tight_layout()
    fig.savefig(path)
