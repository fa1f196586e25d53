"""Train a tiny checkpoint for parallel decoding on standard-library sources, offline, in about a minute.

Two objectives, each added to the plain next-token loss:
- `nld`: Nemotron-Labs-Diffusion block diffusion. A block `[seed, x or mask ...]` attends bidirectionally to
  itself over the causal clean prefix; a mask row predicts its own slot (`dlm_type: llada`, as NLD ships).
- `wedlm`: WeDLM topological reordering. Filled slots of a partially masked block come first, masks after, all
  at their logical positions under causal attention; a mask row predicts its own token, as `wedlm` reads.

    python scripts/train_tiny_dlm.py --objective nld OUTDIR [--steps 300]
"""

import argparse
import sysconfig
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast

from scripts.make_tiny_models import as_wedlm, build_model, train_tokenizer

SEQ, BATCH, BLOCK = 96, 32, 8
NEG = torch.finfo(torch.float32).min


def corpus(tokenizer: PreTrainedTokenizerFast, num_files: int = 60) -> torch.Tensor:
    """Token ids of the first standard-library modules, in a fixed order."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:num_files]
    ids: list[int] = []
    for path in files:
        ids += tokenizer.encode(path.read_text(encoding="utf-8", errors="ignore"))
    return torch.tensor(ids)


def block_batch(x: torch.Tensor, start: int, mask_id: int, objective: str, gen: torch.Generator):
    """Inputs, positions, visibility and (row, target) pairs for one noisy block at `start`."""
    batch = x.shape[0]
    masked = torch.rand(batch, BLOCK, generator=gen) < torch.rand(batch, 1, generator=gen).clamp_min(0.15)
    if objective == "nld":
        masked[:, 0] = False
        block = x[:, start : start + BLOCK].masked_fill(masked, mask_id)
        n = start + BLOCK
        visible = torch.ones(n, n, dtype=torch.bool).tril()
        visible[start:, start:] = True
        rows = torch.arange(start + 1, start + BLOCK)
        return torch.cat([x[:, :start], block], 1), torch.arange(n).expand(batch, n), visible, rows, masked[:, 1:], \
            x[:, start + 1 : start + BLOCK]
    order = torch.argsort(masked.long(), dim=1, stable=True)
    block = x[:, start : start + BLOCK].masked_fill(masked, mask_id).gather(1, order)
    positions = torch.cat([torch.arange(start).expand(batch, start), start + order], 1)
    n = start + BLOCK
    rows = torch.arange(start, n)
    targets = x[:, start : start + BLOCK].gather(1, order)
    return torch.cat([x[:, :start], block], 1), positions, torch.ones(n, n, dtype=torch.bool).tril(), rows, \
        masked.gather(1, order), targets


def train(objective: str, steps: int, seed: int = 0) -> tuple[torch.nn.Module, PreTrainedTokenizerFast]:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    tokenizer = train_tokenizer()
    data = corpus(tokenizer)
    model = build_model("qwen3", len(tokenizer), tokenizer.mask_token_id, tokenizer.eos_token_id, seed=seed,
                        hidden_size=128, num_layers=3)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.02)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0)
    model.train()
    for step in range(steps):
        offsets = torch.randint(0, len(data) - SEQ, (BATCH,), generator=gen)
        x = torch.stack([data[i : i + SEQ] for i in offsets.tolist()])
        ar_loss = model(input_ids=x, labels=x).loss
        start = int(torch.randint(8, SEQ - BLOCK, (1,), generator=gen))
        ids, positions, visible, rows, masked, targets = block_batch(x, start, tokenizer.mask_token_id, objective, gen)
        mask = torch.zeros(visible.shape).masked_fill(~visible, NEG).expand(BATCH, 1, *visible.shape)
        logits = model(input_ids=ids, position_ids=positions, attention_mask=mask).logits[:, rows]
        mask_loss = torch.nn.functional.cross_entropy(logits[masked], targets[masked])
        optimizer.zero_grad()
        (ar_loss + mask_loss).backward()
        optimizer.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"step {step}: ar {ar_loss.item():.3f} mask {mask_loss.item():.3f}", flush=True)
    return model.eval(), tokenizer


def save(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, path: Path, objective: str) -> Path:
    """Write the checkpoint; a WeDLM-objective one is dressed the way WeDLM checkpoints ship."""
    if objective == "nld":
        model.config.dlm_type = "llada"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    if objective == "wedlm":
        as_wedlm(path, path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir")
    parser.add_argument("--objective", choices=["nld", "wedlm"], default="nld")
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    path = save(*train(args.objective, args.steps), Path(args.outdir), args.objective)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
