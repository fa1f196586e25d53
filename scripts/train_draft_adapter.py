"""Train a draft-only LoRA for `diffusion_self` on an off-the-shelf AR checkpoint (SmolLM2): NLD's drafter (seed 001,
a LoRA switched on only while drafting, the base untouched, so the output stays the base's exactly).

    python -m scripts.train_draft_adapter --model DIR OUTDIR [--device cuda] [--steps N] [--prompts N]

The shipped adapter (`scripts/trained/smollm2_draft`, on `python -m scripts.smollm2`'s checkpoint) is three runs on
one H100 (docs/smollm2.md): `--device cuda --target text --stop-at 724`, then `--device cuda --target text
--init-adapter FIRST --steps 900 --stop-at 329`, then `--device cuda --init-adapter SECOND --sampled 1 --steps 600`.

The data are the base's own answers to training chat prompts (`scripts.chat_prompts`, held-out topics never seen):
the greedy one and `--sampled` more at `--temperature`. A slot's label is the base's argmax on the clean row before
it (`--target base`: what verification accepts, also on sampled text) or the text's token (`--target text`).
Each training row is NLD's two-stream layout: the clean answer, causal, and a noisy copy cut into blocks `[seed,
mask x (block - 1)]` that attend bidirectionally inside and causally to the clean tokens before their seed.
The adapter (every target module, `--targets`) is applied to the noisy rows only, so the clean rows' KV is the
base's, as the cached prefix is at inference; slot j is read on row j - 1 (`dlm_type: dream`, an AR model's
shifted logits). Ends by measuring drafts accepted per verify step on held-out prompts with the reference runner.
"""

import argparse
import json
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from parallel_decoding.common.checkpoint import eos_token_ids, load
from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.diffusion_self import DRAFT_ADAPTER, DiffusionSelfConfig
from parallel_decoding.common.lora import LoRA
from parallel_decoding.common.methods import make_decoder
from parallel_decoding.common.runner import ReferenceRunner
from parallel_decoding.common.sampling import SamplingParams
from scripts import chat_prompts
from scripts.train import Recipe, noisy_blocks

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class DraftRecipe:
    """Defaults fit a few minutes of one GPU; `--device cpu` with fewer prompts and steps runs on 2 cores."""

    block_size: int = 9  # the seed and 8 draft slots
    rank: int = 16
    alpha: int = 32
    targets: tuple[str, ...] = TARGETS
    prompts: int = 1536
    new_tokens: int = 192
    steps: int = 1500
    batch_size: int = 32
    lr: float = 1e-3
    seed: int = 0
    generate_batch: int = 256
    max_seconds: float | None = None  # training stops early past this (the steps run are recorded)
    stop_at: int | None = None  # training stops after this many steps, the schedule still that of `steps`
    sampled: int = 0  # sampled answers per prompt beside the greedy one (more contexts to draft in)
    temperature: float = 0.8  # of the sampled answers
    target: str = "base"  # a slot's label: the base's argmax after the clean prefix ("base") or the text's token


@torch.no_grad()
def answers(model, tokenizer, prompts: list[str], new_tokens: int, batch: int, temperature: float = 0.0
            ) -> list[tuple[list[int], int]]:
    """(prompt + the base's answer, the prompt's length) per prompt, the answer cut after its first EOS: greedy at
    temperature 0, else sampled."""
    device = next(model.parameters()).device
    eos = set(eos_token_ids(model, tokenizer))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    rendered = sorted((chat_prompts.render(tokenizer, p) for p in prompts), key=len)
    rows = []
    for start in range(0, len(rendered), batch):
        chunk = rendered[start : start + batch]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in chunk], device=device)
        attention = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in chunk], device=device)
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature else {
            "do_sample": False}
        out = model.generate(input_ids=ids, attention_mask=attention, max_new_tokens=new_tokens, pad_token_id=pad,
                             **sampling)
        for prompt, row in zip(chunk, out[:, width:].tolist(), strict=True):
            cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
            rows.append((prompt + row[:cut], len(prompt)))
        print(f"answers at temperature {temperature}: {len(rows)}/{len(rendered)}", flush=True)
    return rows


class RowLoRA:
    """Trainable low-rank deltas on the target modules, added to the rows from `split` on (the noisy stream)."""

    def __init__(self, model: torch.nn.Module, recipe: DraftRecipe, gen: torch.Generator,
                 init: Path | None = None) -> None:
        self.scale = recipe.alpha / recipe.rank
        self.split = 0
        self.weights: dict[str, torch.nn.Parameter] = {}
        self.handles = []
        device = next(model.parameters()).device
        for name, module in model.named_modules():
            if name.split(".")[-1] in recipe.targets and isinstance(module, torch.nn.Linear):
                down = torch.randn(recipe.rank, module.in_features, generator=gen) / math.sqrt(module.in_features)
                up = torch.zeros(module.out_features, recipe.rank)
                a = self.weights[f"base_model.model.{name}.lora_A.weight"] = torch.nn.Parameter(down.to(device))
                b = self.weights[f"base_model.model.{name}.lora_B.weight"] = torch.nn.Parameter(up.to(device))
                self.handles.append(module.register_forward_hook(self.hook(a, b)))
        if init is not None:  # go on from an adapter trained before (same targets and rank)
            for key, value in load_file(init / "adapter_model.safetensors").items():
                self.weights[key].data.copy_(value.float())

    def hook(self, down: torch.nn.Parameter, up: torch.nn.Parameter):
        def apply(module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
            noisy = inputs[0][:, self.split :].float()
            delta = ((noisy @ down.T) @ up.T * self.scale).to(output.dtype)
            return torch.cat([output[:, : self.split], output[:, self.split :] + delta], 1)

        return apply

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def batches(rows: list[tuple[list[int], int]], recipe: DraftRecipe, pad: int, gen: torch.Generator
            ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Random batches: token ids [batch, L] (right-padded) and which positions are answer tokens to draft."""
    while True:
        picks = torch.randint(0, len(rows), (recipe.batch_size,), generator=gen).tolist()
        width = max(len(rows[i][0]) for i in picks)
        ids = torch.full((recipe.batch_size, width), pad)
        answer = torch.zeros(recipe.batch_size, width, dtype=torch.bool)
        for b, i in enumerate(picks):
            tokens, prompt_len = rows[i]
            ids[b, : len(tokens)] = torch.tensor(tokens)
            answer[b, prompt_len : len(tokens)] = True
        yield ids, answer


def two_stream_mask(starts: torch.Tensor, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive [batch, 1, 2L, 2L] mask, built on the rows' device: the clean stream causal; a noisy row sees the
    clean positions before its block's seed and its own block."""
    batch, length = starts.shape
    pos = torch.arange(length, device=starts.device)
    causal = (pos[None, :] <= pos[:, None]).expand(batch, length, length)
    top = torch.cat([causal, torch.zeros_like(causal)], 2)
    bottom = torch.cat([pos[None, None, :] < starts[:, :, None], index[:, :, None] == index[:, None, :]], 2)
    visible = torch.cat([top, bottom], 1)[:, None]
    return torch.zeros(visible.shape, dtype=dtype, device=starts.device).masked_fill(~visible, torch.finfo(dtype).min)


def draft_loss(model, lora: RowLoRA, ids: torch.Tensor, answer: torch.Tensor, mask_id: int, recipe: DraftRecipe,
               gen: torch.Generator) -> torch.Tensor:
    """Cross-entropy of every drafted answer slot, read on the row before it in its noisy block, against the text's
    token or the base's argmax on the clean row before it (what verification accepts, also on sampled text)."""
    batch, length = ids.shape
    starts, index, masked = noisy_blocks(ids, replace(Recipe(), block_size=recipe.block_size), gen, keep_seed=True,
                                         drafts=True)
    device = next(model.parameters()).device
    mask = two_stream_mask(starts.to(device), index.to(device), next(model.parameters()).dtype)
    noisy = ids.masked_fill(masked, mask_id)
    positions = torch.arange(length).repeat(2).expand(batch, 2 * length)
    lora.split = length
    hidden = model.model(input_ids=torch.cat([ids, noisy], 1).to(device), position_ids=positions.to(device),
                         attention_mask=mask).last_hidden_state
    slots = (masked & answer)[:, 1:].to(device)  # slot p + 1 is read on noisy row p
    logits = model.lm_head(hidden[:, length:][:, :-1][slots]).float()
    if recipe.target == "text":
        labels = ids[:, 1:].to(device)[slots]
    else:
        with torch.no_grad():
            labels = model.lm_head(hidden[:, : length - 1][slots]).argmax(-1)
    return F.cross_entropy(logits, labels)


def train(model, tokenizer, recipe: DraftRecipe, init: Path | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """The adapter's PEFT tensors and the run's record (data, steps, loss, seconds)."""
    gen = torch.Generator().manual_seed(recipe.seed)
    for param in model.parameters():
        param.requires_grad_(False)
    start = time.perf_counter()
    prompts = chat_prompts.sample("train", recipe.prompts, recipe.seed)
    rows = answers(model, tokenizer, prompts, recipe.new_tokens, recipe.generate_batch)
    for _ in range(recipe.sampled):
        rows += answers(model, tokenizer, prompts, recipe.new_tokens, recipe.generate_batch, recipe.temperature)
    data_seconds = time.perf_counter() - start
    lora = RowLoRA(model, recipe, gen, init)
    params = list(lora.weights.values())
    optimizer = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=0.0)
    warmup = max(recipe.steps // 20, 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min((s + 1) / warmup, 0.5 * (
        1 + math.cos(math.pi * min(s / recipe.steps, 1.0)))))
    mask_id = model.config.mask_token_id
    stream = batches(rows, recipe, min(eos_token_ids(model, tokenizer)), gen)
    losses = []
    start = time.perf_counter()
    for step in range(recipe.steps):
        if ((recipe.max_seconds is not None and time.perf_counter() - start > recipe.max_seconds)
                or (recipe.stop_at is not None and step >= recipe.stop_at)):
            break
        ids, answer = next(stream)
        loss = draft_loss(model, lora, ids, answer, mask_id, recipe, gen)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if step % 100 == 0 or step == recipe.steps - 1:
            print(f"step {step}: loss {sum(losses[-100:]) / len(losses[-100:]):.3f}", flush=True)
    lora.remove()
    record = {"rows": len(rows), "answer_tokens": sum(len(t) - p for t, p in rows), "data_seconds": data_seconds,
              "steps_run": len(losses), "train_seconds": time.perf_counter() - start,
              "final_loss": sum(losses[-100:]) / len(losses[-100:])}
    return {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in lora.weights.items()}, record


def save(adapter: dict[str, torch.Tensor], recipe: DraftRecipe, outdir: Path, record: dict) -> Path:
    """A PEFT LoRA directory (what `draft_adapter` names) with the recipe and the run's record beside it."""
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": recipe.rank, "lora_alpha": recipe.alpha, "target_modules": list(recipe.targets),
        "bias": "none", "lora_dropout": 0.0}, indent=1) + "\n")
    save_file(adapter, outdir / "adapter_model.safetensors", metadata={"format": "pt"})
    (outdir / "recipe.json").write_text(json.dumps({**asdict(recipe), **record}, indent=1) + "\n")
    return outdir


def acceptance(model, tokenizer, adapter_dir: Path, drafts: int, prompts: int = 16, max_tokens: int = 128) -> dict:
    """Greedy `diffusion_self` with the adapter on held-out prompts: tokens per verify step and per forward."""
    lora = LoRA(model, adapter_dir)
    runner = ReferenceRunner(model, adapters={DRAFT_ADAPTER: lora.enabled})
    config = DiffusionSelfConfig(num_speculative_tokens=drafts, mask_token_id=model.config.mask_token_id,
                                 draft_adapter=str(adapter_dir), dlm_type="dream")
    limits = Limits(max_tokens=max_tokens, eos_token_ids=eos_token_ids(model, tokenizer))
    tokens = forwards = 0
    for prompt in chat_prompts.sample("heldout", prompts):
        decoder = make_decoder("diffusion_self", config, chat_prompts.render(tokenizer, prompt),
                               SamplingParams(), limits)
        result = runner.run(decoder)
        tokens += len(result.token_ids)
        forwards += result.forwards
    return {"drafts": drafts, "tokens": tokens, "forwards": forwards, "tokens_per_forward": tokens / forwards,
            "tokens_per_step": 2 * tokens / forwards}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.train_draft_adapter", description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--model", required=True, help="the AR checkpoint (e.g. `python -m scripts.smollm2`'s)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=DraftRecipe.steps)
    parser.add_argument("--prompts", type=int, default=DraftRecipe.prompts)
    parser.add_argument("--batch-size", type=int, default=DraftRecipe.batch_size)
    parser.add_argument("--rank", type=int, default=DraftRecipe.rank)
    parser.add_argument("--block-size", type=int, default=DraftRecipe.block_size)
    parser.add_argument("--new-tokens", type=int, default=DraftRecipe.new_tokens)
    parser.add_argument("--max-seconds", type=float, default=None, help="stop training past this many seconds")
    parser.add_argument("--stop-at", type=int, default=None,
                        help="stop after this many steps (a --max-seconds run's `steps_run`, to reproduce it)")
    parser.add_argument("--init-adapter", type=Path, default=None, help="go on training this adapter")
    parser.add_argument("--sampled", type=int, default=DraftRecipe.sampled,
                        help="sampled answers per prompt beside the greedy one")
    parser.add_argument("--temperature", type=float, default=DraftRecipe.temperature)
    parser.add_argument("--target", choices=("base", "text"), default=DraftRecipe.target,
                        help="a slot's label: the base's argmax after the clean prefix, or the text's token")
    parser.add_argument("--eval-prompts", type=int, default=16, help="held-out prompts the acceptance is measured on")
    parser.add_argument("--eval-tokens", type=int, default=128)
    parser.add_argument("--eval-drafts", default="4,8", help="draft counts the acceptance is measured at")
    args = parser.parse_args()
    recipe = DraftRecipe(steps=args.steps, prompts=args.prompts, batch_size=args.batch_size, rank=args.rank,
                         alpha=2 * args.rank, block_size=args.block_size, new_tokens=args.new_tokens,
                         max_seconds=args.max_seconds, stop_at=args.stop_at, sampled=args.sampled,
                         temperature=args.temperature, target=args.target)
    torch.manual_seed(recipe.seed)
    model, tokenizer = load(args.model, device=args.device, dtype=torch.bfloat16)
    adapter, record = train(model, tokenizer, recipe, args.init_adapter)
    if args.init_adapter is not None:
        previous = json.loads((args.init_adapter / "recipe.json").read_text())
        record["init"] = {k: previous.get(k) for k in ("steps_run", "train_seconds", "final_loss", "device")}
    record["device"] = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    path = save(adapter, recipe, args.outdir, record)
    record["acceptance"] = [acceptance(model, tokenizer, path, k, args.eval_prompts, args.eval_tokens)
                            for k in map(int, args.eval_drafts.split(","))]
    save(adapter, recipe, args.outdir, record)
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
