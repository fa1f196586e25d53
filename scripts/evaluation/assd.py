"""ASSD against sequential any-order decoding of the same any-subset AR model (seed 004, Table 1), on held-out text:
model calls (NFE), n-gram draft calls, tokens per call and wall time, continuing a 5% prompt left to right and filling
95% holes (5% of the positions kept at random) in a random order, at each sequence length."""

import time
from collections.abc import Sequence

import torch
from tqdm import tqdm
from transformers import PreTrainedTokenizerFast, XLNetLMHeadModel

from parallel_decoding.common.assd.decoding import AssdConfig, infill
from parallel_decoding.common.sampling import SamplingParams
from scripts import corpus

TASKS = {"continuation": "left_to_right", "infilling": "random"}
DRAFTERS = ("none", "self", "ngram")
KEEP = 0.05


def masked(sequence: list[int], task: str, mask_id: int, generator: torch.Generator) -> list[int]:
    """The task's input: a 5% prefix (continuation) or 5% of the positions at random (infilling), the rest holes."""
    keep = max(int(len(sequence) * KEEP), 1)
    if task == "continuation":
        kept = set(range(keep))
    else:
        kept = set(torch.randperm(len(sequence), generator=generator)[:keep].tolist())
    return [t if i in kept else mask_id for i, t in enumerate(sequence)]


def run(model: str, lengths: Sequence[int] = (128, 512), samples: int = 4, k: int = 5, temperature: float = 1.0
        ) -> dict:
    """Each length x task x drafter on `samples` windows, on at most 2 threads (the documented rows'); printed."""
    torch.set_num_threads(min(torch.get_num_threads(), 2))
    asarm = XLNetLMHeadModel.from_pretrained(model, dtype=torch.float32).eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model)
    mask_id = tokenizer.mask_token_id
    data = corpus.token_ids(tokenizer, corpus.files(held_out=True))
    report: dict = {"model": model, "k": k, "temperature": temperature, "samples": samples, "runs": []}
    cases = [(n, task, drafter) for n in lengths for task in TASKS for drafter in DRAFTERS]
    for n, task, drafter in tqdm(cases, desc="assd bench"):
        config = AssdConfig(k=k, drafter=drafter, order=TASKS[task])
        totals = {"nfe": 0, "draft_calls": 0, "generated": 0, "seconds": 0.0}
        for sample in range(samples):
            generator = torch.Generator().manual_seed(sample)
            start = int(torch.randint(0, len(data) - n, (1,), generator=generator))
            tokens = masked(data[start : start + n].tolist(), task, mask_id, generator)
            began = time.perf_counter()
            result = infill(asarm, tokens, mask_id, config, SamplingParams(temperature=temperature, seed=sample))
            totals["seconds"] += time.perf_counter() - began
            assert result.nfe <= result.generated  # Theorem 1 (n-gram drafts too: one call per iteration)
            for key in ("nfe", "draft_calls", "generated"):
                totals[key] += getattr(result, key)
        report["runs"].append({"length": n, "task": task, "drafter": drafter, **totals,
                               "tokens_per_call": totals["generated"] / totals["nfe"]})
    for row in report["runs"]:
        base = next(r for r in report["runs"] if r["length"] == row["length"] and r["task"] == row["task"]
                    and r["drafter"] == "none")
        row["nfe_vs_sequential"] = row["nfe"] / base["nfe"]
        row["speedup"] = base["seconds"] / row["seconds"]
    print(f"{'length':>6} {'task':<13} {'drafter':<8} {'NFE':>6} {'drafts':>6} {'tok/call':>8} {'NFE/seq':>8} "
          f"{'speedup':>8}")
    for r in report["runs"]:
        print(f"{r['length']:>6} {r['task']:<13} {r['drafter']:<8} {r['nfe']:>6} {r['draft_calls']:>6} "
              f"{r['tokens_per_call']:>8.2f} {r['nfe_vs_sequential']:>8.3f} {r['speedup']:>8.2f}")
    return report


def plot(report: dict, path: str) -> None:
    """Per length and task, each drafter's model calls and wall-clock speedup against sequential decoding."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["length"], r["task"]) for r in report["runs"]})
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(DRAFTERS)
    for j, drafter in enumerate(DRAFTERS):
        rows = [next(r for r in report["runs"] if (r["length"], r["task"]) == g and r["drafter"] == drafter)
                for g in groups]
        xs = [i + j * width for i in range(len(groups))]
        label = "sequential" if drafter == "none" else f"ASSD ({drafter})"
        left.bar(xs, [r["nfe_vs_sequential"] for r in rows], width, label=label)
        right.bar(xs, [r["speedup"] for r in rows], width, label=label)
    for axis, title in ((left, "model calls / sequential's"), (right, "wall-clock speedup over sequential")):
        axis.set_xticks([i + width for i in range(len(groups))], [f"{t}\n{n} tokens" for n, t in groups])
        axis.set_title(title)
        axis.axhline(1.0, color="grey", linestyle=":")
    left.legend()
    fig.suptitle(f"ASSD, k = {report['k']}, T = {report['temperature']}")
    fig.tight_layout()
    fig.savefig(path)
