"""NLD's speed-of-light analysis (seed 001, section 4) for any mask-trained checkpoint: how many tokens per forward
the diffusion mode could commit under an optimal sampler, against greedy acceptance and confidence sampling.

Per block `[seed, mask x (B-1)]` (bidirectional over the cached prefix, slots read as the checkpoint's `dlm_type`
says, the mask token never predicted):
- serial denoising: each forward commits the argmax of the masked slot with the highest peak probability; B-1
  forwards give the block's target t (the next block starts after it);
- greedy acceptance: each forward commits every masked slot whose argmax equals t (else the most confident slot's
  argmax); tokens per forward (B-1)/K, exact when it reproduces t;
- recursive dynamic compaction (SOL): each forward commits the largest confidence-ranked prefix of the matching
  slots whose commit is safe, i.e. greedy acceptance from there still reproduces t (binary search, a budget of
  forwards per block; the top match is always taken); always exact.

    python -m scripts.sol --model DIR [--block-sizes 4 8 16] [--prompts 8] [--blocks 2] [--png OUT.png] [--json OUT]
"""

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import DynamicCache

from parallel_decoding.common.attention import additive_mask
from parallel_decoding.common.checkpoint import load, resolve_mask_token_id
from parallel_decoding.common.draft_layout import DEFAULT_DLM_TYPE, draft_rows
from parallel_decoding.common.sampling import without_token
from parallel_decoding.common.window import Attention, Forward
from scripts import corpus

BUDGET = 5000  # forwards per block for the safety checks, as the paper's


@dataclass
class Block:
    """One block's oracle: the model over a fixed prefix, called with the block's slot contents."""

    model: torch.nn.Module
    cache: DynamicCache
    prefix_len: int
    seed: int
    mask_id: int
    rows: torch.Tensor
    forwards: int = 0

    @torch.inference_mode()
    def predict(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Argmax and its probability per slot for the block `[seed, slots]`."""
        ids = torch.cat([torch.tensor([self.seed]), slots])
        forward = Forward(ids, torch.arange(self.prefix_len, self.prefix_len + len(ids)), self.rows,
                          Attention.BIDIRECTIONAL)
        mask = additive_mask(forward, self.prefix_len, torch.float32)
        logits = self.model(input_ids=ids[None], position_ids=forward.positions[None], attention_mask=mask,
                            past_key_values=self.cache, use_cache=True).logits[0, self.rows].float()
        self.cache.crop(-len(ids))
        self.forwards += 1
        probs = without_token(logits, self.mask_id).softmax(-1)
        confidence, tokens = probs.max(-1)
        return tokens, confidence


def serial(block: Block, size: int) -> list[int]:
    slots = torch.full((size,), block.mask_id)
    for _ in range(size):
        tokens, confidence = block.predict(slots)
        masked = slots == block.mask_id
        j = int(confidence.masked_fill(~masked, -1).argmax())
        slots[j] = tokens[j]
    return slots.tolist()


def greedy(block: Block, slots: torch.Tensor, target: torch.Tensor, budget: int) -> tuple[int, bool]:
    """Greedy acceptance from `slots`: (forwards, whether it reproduced `target`); stops as unsafe past `budget`."""
    slots, forwards, exact = slots.clone(), 0, True
    while (slots == block.mask_id).any():
        if forwards >= budget:
            return forwards, False
        tokens, confidence = block.predict(slots)
        forwards += 1
        masked = slots == block.mask_id
        match = masked & (tokens == target)
        if not match.any():
            exact = False
            match[int(confidence.masked_fill(~masked, -1).argmax())] = True
        slots[match] = tokens[match]
    return forwards, exact and torch.equal(slots, target)


def compaction(block: Block, target: torch.Tensor) -> int:
    """Recursive dynamic compaction: forwards to reproduce `target` committing the largest safe set each time."""
    slots, forwards, spent = torch.full_like(target, block.mask_id), 0, 0
    while (slots == block.mask_id).any():
        tokens, confidence = block.predict(slots)
        forwards += 1
        masked = slots == block.mask_id
        matched = (masked & (tokens == target)).nonzero().flatten()
        if len(matched) == 0:  # off the serial path: take the serial step's slot with its target token
            j = int(confidence.masked_fill(~masked, -1).argmax())
            slots[j] = target[j]
            continue
        ranked = matched[confidence[matched].argsort(descending=True)]
        good, lo, hi = 1, 2, len(ranked)
        while lo <= hi:
            k = (lo + hi) // 2
            trial = slots.clone()
            trial[ranked[:k]] = target[ranked[:k]]
            used, safe = greedy(block, trial, target, max(BUDGET - spent, 0))
            spent += used
            if safe:
                good, lo = k, k + 1
            else:
                hi = k - 1
        slots[ranked[:good]] = target[ranked[:good]]
    return forwards


@dataclass
class Tally:
    tokens: int = 0
    forwards: dict[str, int] = field(default_factory=lambda: {"serial": 0, "greedy": 0, "sol": 0})
    greedy_exact: int = 0
    blocks: int = 0

    def tokens_per_forward(self) -> dict[str, float]:
        return {name: self.tokens / max(n, 1) for name, n in self.forwards.items()}


@torch.inference_mode()
def analyse(model_dir: str, block_size: int, prompts: list[str], blocks: int) -> Tally:
    model, tokenizer = load(model_dir)
    mask_id = resolve_mask_token_id(model.config, tokenizer)
    dlm_type = getattr(model.config, "dlm_type", None) or DEFAULT_DLM_TYPE
    size, tally = block_size - 1, Tally()
    for prompt in prompts:
        ids = tokenizer.encode(prompt)
        for _ in range(blocks):
            cache = DynamicCache(config=model.config)
            model(input_ids=torch.tensor([ids[:-1]]), past_key_values=cache, use_cache=True)
            block = Block(model, cache, len(ids) - 1, ids[-1], mask_id, draft_rows(size, dlm_type))
            target = torch.tensor(serial(block, size))
            used, exact = greedy(block, torch.full_like(target, mask_id), target, BUDGET)
            tally.tokens += size
            tally.forwards["serial"] += size
            tally.forwards["greedy"] += used
            tally.greedy_exact += exact
            tally.forwards["sol"] += compaction(block, target)
            tally.blocks += 1
            ids = ids + target.tolist()
    return tally


def plot(results: dict[int, Tally], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(results)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.27
    for i, name in enumerate(["serial", "greedy", "sol"]):
        values = [results[b].tokens_per_forward()[name] for b in sizes]
        ax.bar([x + (i - 1) * width for x in range(len(sizes))], values, width, label=name)
    ax.set_xticks(range(len(sizes)), [f"B={b}" for b in sizes])
    ax.set_ylabel("tokens per forward")
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=150)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.sol", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--block-sizes", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--prompts", type=int, default=8, help="held-out prompts (scripts.corpus)")
    parser.add_argument("--blocks", type=int, default=2, help="blocks per prompt")
    parser.add_argument("--png", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(min(torch.get_num_threads(), 2))
    prompts = corpus.prompts(args.prompts)
    results = {}
    print(f"{'block':>6} {'serial':>7} {'greedy':>7} {'exact':>6} {'SOL':>6}  (tokens per forward)")
    for size in args.block_sizes:
        tally = results[size] = analyse(args.model, size, prompts, args.blocks)
        tpf = tally.tokens_per_forward()
        print(f"{size:>6} {tpf['serial']:>7.2f} {tpf['greedy']:>7.2f} {tally.greedy_exact / tally.blocks:>6.0%} "
              f"{tpf['sol']:>6.2f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({b: {**t.tokens_per_forward(), "greedy_exact": t.greedy_exact,
                                                   "blocks": t.blocks} for b, t in results.items()}, indent=1))
    if args.png:
        plot(results, args.png, f"diffusion SOL on {args.model}, {len(prompts)} prompts x {args.blocks} blocks")


if __name__ == "__main__":
    main()
