"""Train the tiny checkpoints the methods are measured on, from standard-library sources, on CPU, deterministically.

Objectives (seed papers in `../shared/seeds/`), each a Qwen3-shaped model with a mask token:
- `ar`: next-token prediction, the base every other objective starts from (`--init`).
- `nld`: NLD's joint AR + block-diffusion loss with the two-stream mask (seed 001, 2.1-2.2): a clean causal stream
  and a noisy stream whose blocks `[seed, x or mask ...]` attend bidirectionally inside and causally to the clean
  stream before them; a mask row predicts its own slot (`dlm_type: llada`). Then NLD's draft adapter, a LoRA on
  `o_proj` trained on the diffusion loss alone with the base frozen, saved in `linear_spec_lora/`.
- `wedlm`: WeDLM's dual-stream masking with intra-block topological reordering (seed 003, section 4): each noisy
  block puts its filled slots first and its masks after, at their logical positions, under causal attention over
  the clean stream; mask rows predict their own slot; plus the auxiliary AR loss.
- Self-distillation (`nld`, `wedlm`): a `distill` fraction of each batch is the `--init` model's greedy
  continuations of corpus windows (`greedy_rows`), the text the decoders must reproduce at temperature 0; the AR
  loss reads the corpus rows only. The draft adapter learns whole drafted blocks over the fine-tuned base's own
  greedy continuations, the tokens its verify pass accepts.
- `jacobi_forcing`: progressive consistency distillation (seed 002, 3.1): the teacher's (`--init`, an `ar` model)
  Jacobi trajectories of a block after a corpus prefix; the student learns to map a trajectory state to the
  teacher's fixed point, at a noise level that grows along the block, with the AR loss on the fixed point.
- `asarm`: an any-subset AR model for ASSD (seed 004), an XLNet from scratch trained with permutation masks on
  the orders ASSD decodes in: given tokens (a prefix or a random subset) first, left to right, then the rest left
  to right or in a random order; each position predicted from the positions before it in that order, the given
  ones seeing each other both ways (the paper's conditioning, `common.assd.decoding.perm_mask`).
- `raven`: a Huginn-style recurrent-depth model (`common.models.raven`, seed 000) from scratch, next-token loss
  with randomized unrolling: each step draws the recurrence count from a Poisson-lognormal around
  `mean_recurrence` and backpropagates through the last `mean_backprop_depth` recurrences only, so the latents
  learn to converge and the adaptive and wavefront samplers have something to exploit.

    python -m scripts.train --objective ar OUTDIR
    python -m scripts.train --objective asarm OUTDIR
    python -m scripts.train --objective nld --init AR_DIR OUTDIR [--steps N] [--seed S]
"""

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import DynamicCache, PreTrainedTokenizerFast, Qwen3ForCausalLM

from parallel_decoding.common.assd.decoding import perm_mask
from parallel_decoding.common.lora import delta_hook
from parallel_decoding.common.models.raven import RavenForCausalLM
from scripts import corpus
from scripts.make_tiny_models import as_wedlm, build_model, build_raven, build_xlnet, train_tokenizer

OBJECTIVES = ("ar", "nld", "wedlm", "jacobi_forcing", "raven", "asarm")
FROM_SCRATCH = ("ar", "raven", "asarm")
# Steps per objective: the base from scratch, the others fine-tuned from it; each under 20 minutes on 2 CPU cores.
DEFAULT_STEPS = {"ar": 1500, "nld": 600, "wedlm": 600, "jacobi_forcing": 600, "raven": 500, "asarm": 900}
ASARM_SEQ_LEN = 128
RAVEN_RECURRENCE, RAVEN_BACKPROP = 16, 4
NEG = torch.finfo(torch.float32).min


@dataclass(frozen=True)
class Recipe:
    """Model shape and optimisation; defaults train each objective in under 20 minutes on 2 CPU cores."""

    hidden_size: int = 256
    num_layers: int = 4
    seq_len: int = 192
    batch_size: int = 16
    steps: int = DEFAULT_STEPS["ar"]
    lr: float = 3e-3
    block_size: int = 16
    lora_rank: int = 32
    lora_alpha: int = 64
    lora_steps: int = 300
    seed: int = 0
    distill: float = 0.5  # the fraction of each `nld` / `wedlm` batch drawn from the teacher's greedy rows
    distill_rows: int = 2048  # greedy rows generated per pool


def batches(data: torch.Tensor, recipe: Recipe, gen: torch.Generator):
    """Random windows of `seq_len` tokens, forever."""
    while True:
        offsets = torch.randint(0, len(data) - recipe.seq_len, (recipe.batch_size,), generator=gen)
        yield torch.stack([data[i : i + recipe.seq_len] for i in offsets.tolist()])


@torch.no_grad()
def greedy_rows(teacher: torch.nn.Module, data: torch.Tensor, recipe: Recipe, gen: torch.Generator,
                chunk: int = 256) -> torch.Tensor:
    """[distill_rows, seq_len] self-distillation data: each row a random corpus window's first third, then the
    teacher's greedy continuation, the text the decoders are asked to reproduce at temperature 0."""
    prefix = recipe.seq_len // 3
    windows = batches(data, replace(recipe, batch_size=chunk), gen)
    rows = []
    while len(rows) * chunk < recipe.distill_rows:
        ids = next(windows)[:, :prefix]
        cache = DynamicCache(config=teacher.config)
        step = ids
        for _ in range(recipe.seq_len - prefix):
            step = teacher(input_ids=step, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
            ids = torch.cat([ids, step], 1)
        rows.append(ids)
    return torch.cat(rows)[: recipe.distill_rows]


def distillation_pool(init: Path, data: torch.Tensor, recipe: Recipe, gen: torch.Generator, device: str
                      ) -> torch.Tensor:
    """The `init` (`ar`) model's greedy continuations, the data the fine-tuned model's masks learn to fill."""
    teacher = Qwen3ForCausalLM.from_pretrained(init, dtype=torch.float32).to(device).eval()
    return greedy_rows(teacher, data, recipe, gen)


def mixed(stream, pool: torch.Tensor, fraction: float, gen: torch.Generator) -> tuple[torch.Tensor, int]:
    """A batch whose last `fraction` of rows come from the distillation `pool`, and how many rows (the first) are
    corpus text."""
    x = next(stream)
    corpus_rows = x.shape[0] - round(fraction * x.shape[0])
    picks = torch.randint(0, pool.shape[0], (x.shape[0] - corpus_rows,), generator=gen)
    return torch.cat([x[:corpus_rows], pool[picks]]), corpus_rows


def block_starts(length: int, block: int, offset: torch.Tensor) -> torch.Tensor:
    """[batch, length]: the first position of each position's block; blocks start at `offset` (per row) + k*block."""
    pos = torch.arange(length)[None]
    start = offset[:, None] + torch.div(pos - offset[:, None], block, rounding_mode="floor") * block
    return start.clamp_min(0)


def two_stream_mask(starts: torch.Tensor, noisy_visible: torch.Tensor) -> torch.Tensor:
    """Additive [batch, 1, 2L, 2L] mask: clean stream causal; noisy token i sees clean positions before its block's
    start and the noisy tokens `noisy_visible[b, i, j]` allows."""
    batch, length = starts.shape
    causal = torch.ones(length, length, dtype=torch.bool).tril().expand(batch, length, length)
    noisy_to_clean = torch.arange(length)[None, None, :] < starts[:, :, None]
    top = torch.cat([causal, torch.zeros_like(causal)], 2)
    bottom = torch.cat([noisy_to_clean, noisy_visible], 2)
    visible = torch.cat([top, bottom], 1)
    return torch.zeros(visible.shape).masked_fill(~visible, NEG)[:, None]


def mask_rates(batch: int, blocks: int, gen: torch.Generator, drafts: bool = False) -> torch.Tensor:
    """Per block the fraction masked: uniform in (0, 1], and all-masked for a third of the blocks (a draft); every
    block all-masked when `drafts`."""
    rate = torch.rand(batch, blocks, generator=gen).clamp_min(0.05)
    return torch.where((torch.rand(batch, blocks, generator=gen) < 1 / 3) | drafts, 1.0, rate)


def noisy_blocks(x: torch.Tensor, recipe: Recipe, gen: torch.Generator, keep_seed: bool, drafts: bool = False):
    """Block starts, block index per position, and which positions are masked (a block's first one kept when
    `keep_seed`; all the others when `drafts`)."""
    batch, length = x.shape
    block = recipe.block_size
    offset = torch.randint(0, block, (batch,), generator=gen)
    starts = block_starts(length, block, offset)
    index = torch.div(torch.arange(length)[None] - offset[:, None] + block, block, rounding_mode="floor")
    rates = mask_rates(batch, length // block + 2, gen, drafts).gather(1, index)
    masked = torch.rand(batch, length, generator=gen) < rates
    if keep_seed:
        masked &= torch.arange(length)[None] != starts
    return starts, index, masked


def nld_loss(model: torch.nn.Module, x: torch.Tensor, mask_id: int, recipe: Recipe, gen: torch.Generator,
             ar_rows: int, drafts: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """NLD's two-stream loss: (AR loss on the clean stream of the first `ar_rows` rows, diffusion loss on the noisy
    stream's masks; every block a draft when `drafts`)."""
    batch, length = x.shape
    starts, index, masked = noisy_blocks(x, recipe, gen, keep_seed=True, drafts=drafts)
    same_block = index[:, :, None] == index[:, None, :]
    ids = torch.cat([x, x.masked_fill(masked, mask_id)], 1)
    positions = torch.arange(length).repeat(2).expand(batch, 2 * length)
    logits = model(input_ids=ids, position_ids=positions, attention_mask=two_stream_mask(starts, same_block)).logits
    return ar_loss(logits[:ar_rows, :length], x[:ar_rows]), F.cross_entropy(logits[:, length:][masked], x[masked])


def ar_loss(logits: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Next-token loss of a clean stream (zero for no rows)."""
    if not len(x):
        return logits.new_zeros(())
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten())


def wedlm_loss(model: torch.nn.Module, x: torch.Tensor, mask_id: int, recipe: Recipe, gen: torch.Generator,
               ar_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """WeDLM's dual-stream loss: (AR loss on the clean stream of the first `ar_rows` rows, mask loss on the
    reordered noisy stream)."""
    batch, length = x.shape
    starts, index, masked = noisy_blocks(x, recipe, gen, keep_seed=False)
    order = torch.argsort(index * 2 * length + masked.long() * length + torch.arange(length), dim=1)
    noisy = x.masked_fill(masked, mask_id).gather(1, order)
    reordered_starts, reordered_index = starts.gather(1, order), index.gather(1, order)
    rank = torch.arange(length)
    visible = (reordered_index[:, :, None] == reordered_index[:, None, :]) & (rank[None, None] <= rank[None, :, None])
    ids = torch.cat([x, noisy], 1)
    positions = torch.cat([torch.arange(length).expand(batch, length), order], 1)
    logits = model(input_ids=ids, position_ids=positions,
                   attention_mask=two_stream_mask(reordered_starts, visible)).logits
    rows = masked.gather(1, order)
    return (ar_loss(logits[:ar_rows, :length], x[:ar_rows]),
            F.cross_entropy(logits[:, length:][rows], x.gather(1, order)[rows]))


@torch.no_grad()
def jacobi_trajectory(teacher: torch.nn.Module, prefix: torch.Tensor, n: int
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy Jacobi decoding of a block after each prefix, as `common.jacobi` runs it: the first greedy token
    [batch], every draft state up to the fixed point [iterations, batch, n] (drafts opened as copies of the first
    token), and the fixed point [batch, n] (the teacher's greedy continuation after the first token)."""
    cache = DynamicCache(config=teacher.config)
    first = teacher(input_ids=prefix, past_key_values=cache, use_cache=True).logits[:, -1].argmax(-1)
    drafts = first[:, None].repeat(1, n)
    states = []
    for _ in range(n + 1):
        states.append(drafts)
        inputs = torch.cat([first[:, None], drafts[:, :-1]], 1)
        new = teacher(input_ids=inputs, past_key_values=cache, use_cache=True).logits.argmax(-1)
        cache.crop(-n)
        if torch.equal(new, drafts):
            break
        drafts = new
    return first, torch.stack(states), drafts


def jacobi_forcing_loss(model: torch.nn.Module, teacher: torch.nn.Module, x: torch.Tensor, recipe: Recipe,
                        gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(AR loss on prefix + fixed point, consistency loss: the fixed point from a trajectory state drawn uniformly
    per sample, every position of the block conditioned on the noisy drafts before it)."""
    n = recipe.block_size
    prefix = x[:, : recipe.seq_len - n - 1]
    first, states, fixed = jacobi_trajectory(teacher, prefix, n)
    batch, p = x.shape[0], prefix.shape[1]
    k = torch.randint(0, states.shape[0], (batch,), generator=gen)
    noisy = states[k, torch.arange(batch)]
    clean = torch.cat([prefix, first[:, None], fixed], 1)
    ids = torch.cat([prefix, first[:, None], noisy], 1)
    logits = model(input_ids=torch.cat([clean, ids])).logits
    consistency = F.cross_entropy(logits[batch:, p : p + n].flatten(0, 1), fixed.flatten())
    return ar_loss(logits[:batch], clean), consistency


def unrolling(mean: int, backprop: int, gen: torch.Generator) -> tuple[int, int]:
    """Huginn's randomized unrolling: (recurrences without gradient, recurrences with gradient), their sum drawn
    from a Poisson-lognormal with mean `mean`, the gradient ones at most `backprop`."""
    sigma = 0.5
    rate = torch.empty(1).log_normal_(math.log(mean) - sigma**2 / 2, sigma, generator=gen)
    total = int(torch.poisson(rate, generator=gen)) + 1
    return max(total - backprop, 0), min(total, backprop)


def raven_loss(model: RavenForCausalLM, x: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor]:
    """Next-token loss of a recurrent-depth model unrolled a random number of times from random latents."""
    positions = torch.arange(x.shape[1] - 1)
    e = model.embed(x[:, :-1], positions, None)
    std = model.config.init_std
    z = torch.nn.init.trunc_normal_(torch.empty_like(e), std=std, a=-3 * std, b=3 * std, generator=gen)
    z = z * model.config.emb_scale
    without, with_grad = unrolling(RAVEN_RECURRENCE, RAVEN_BACKPROP, gen)
    with torch.no_grad():
        for t in range(without):
            z = model.recur(z, e.detach(), positions, None, t)
    for t in range(with_grad):
        z = model.recur(z, e, positions, None, without + t)
    logits = model.decode(z, positions, None)
    return (F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()),)


def asarm_orders(batch: int, length: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """([batch, length] rank of each position, [batch, length] given) for decoding orders ASSD uses: the given
    positions (a prefix in half the rows, a random subset of random density in the others) first, left to right,
    then the rest left to right in half the rows and in a random order in the others."""
    pos = torch.arange(length).expand(batch, length)
    prefix = torch.rand(batch, 1, generator=gen) < 0.5
    cut = (torch.rand(batch, 1, generator=gen) * length).long()
    scattered = torch.rand(batch, length, generator=gen) < torch.rand(batch, 1, generator=gen)
    given = torch.where(prefix, pos < cut, scattered)
    shuffled = torch.rand(batch, 1, generator=gen) < 0.5
    hole_key = torch.where(shuffled, torch.rand(batch, length, generator=gen) * length, pos.float())
    key = torch.where(given, pos.float(), length + hole_key)
    return key.argsort(-1).argsort(-1), given


def asarm_loss(model: torch.nn.Module, x: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor]:
    """XLNet's permutation LM on ASSD's orders: every position not given predicts its token from the positions
    ranked before it (the query stream never sees its own content; the given positions see each other, as in
    `common.assd.decoding.perm_mask`); the given ones carry no loss."""
    x = x[:, :ASARM_SEQ_LEN]
    batch, length = x.shape
    ranks, given = asarm_orders(batch, length, gen)
    perm = perm_mask(ranks, given)
    mapping = torch.eye(length).expand(batch, length, length)
    labels = x.masked_fill(given, -100)
    return (model(x, perm_mask=perm, target_mapping=mapping, labels=labels, use_mems=False).loss,)


def base_model(tokenizer: PreTrainedTokenizerFast, recipe: Recipe, init: Path | None) -> torch.nn.Module:
    if init is not None:
        return Qwen3ForCausalLM.from_pretrained(init, dtype=torch.float32)
    model = build_model("qwen3", len(tokenizer), tokenizer.mask_token_id, tokenizer.eos_token_id, seed=recipe.seed,
                        hidden_size=recipe.hidden_size, num_layers=recipe.num_layers)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.02)
    return model


def schedule(step: int, steps: int) -> float:
    """Linear warm-up over 5% of the steps, then cosine decay to 10%."""
    warm = max(steps // 20, 1)
    if step < warm:
        return (step + 1) / warm
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(steps - warm, 1)))


def optimise(params: list[torch.nn.Parameter], steps: int, lr: float, loss_fn, label: str) -> None:
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    lr_at = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: schedule(s, steps))
    start = time.perf_counter()
    for step in range(steps):
        losses = loss_fn()
        optimizer.zero_grad()
        sum(losses).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        lr_at.step()
        if step % 100 == 0 or step == steps - 1:
            parts = " ".join(f"{loss.item():.3f}" for loss in losses)
            print(f"{label} step {step}/{steps}: loss {parts} ({time.perf_counter() - start:.0f} s)", flush=True)


def train(objective: str, recipe: Recipe, init: Path | None = None, device: str = "cpu"
          ) -> tuple[torch.nn.Module, dict | None]:
    """The trained model (float32) and, for `nld`, the draft LoRA's PEFT tensors."""
    with torch.device(device):
        return _train(objective, recipe, init, device)


def _train(objective: str, recipe: Recipe, init: Path | None, device: str) -> tuple[torch.nn.Module, dict | None]:
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if objective not in FROM_SCRATCH and init is None:
        raise ValueError(f"--init (an `ar` checkpoint) is required for {objective}")
    torch.manual_seed(recipe.seed)
    gen = torch.Generator(device).manual_seed(recipe.seed)
    tokenizer = train_tokenizer()
    data = corpus.token_ids(tokenizer, corpus.files(held_out=False))
    stream = batches(data, recipe, gen)
    if objective == "raven":
        model = build_raven(len(tokenizer), seed=recipe.seed, hidden_size=recipe.hidden_size,
                            mean_recurrence=RAVEN_RECURRENCE).to(device).train()
    elif objective == "asarm":
        model = build_xlnet(len(tokenizer), tokenizer.mask_token_id, seed=recipe.seed, d_model=recipe.hidden_size,
                            n_layer=recipe.num_layers, init_std=0.02).to(device).train()
    else:
        model = base_model(tokenizer, recipe, init).to(device).train()
    mask_id = tokenizer.mask_token_id
    if objective == "raven":
        def loss_fn():
            return raven_loss(model, next(stream), gen)
    elif objective == "asarm":
        def loss_fn():
            return asarm_loss(model, next(stream), gen)
    elif objective == "ar":
        def loss_fn():
            x = next(stream)
            return (model(input_ids=x, labels=x).loss,)
    elif objective in ("nld", "wedlm"):
        pool = distillation_pool(init, data, recipe, gen, device)
        method_loss = nld_loss if objective == "nld" else wedlm_loss

        def loss_fn():
            x, corpus_rows = mixed(stream, pool, recipe.distill, gen)
            return method_loss(model, x, mask_id, recipe, gen, corpus_rows)
    else:
        teacher = Qwen3ForCausalLM.from_pretrained(init, dtype=torch.float32).to(device).eval()

        def loss_fn():
            return jacobi_forcing_loss(model, teacher, next(stream), recipe, gen)
    optimise(list(model.parameters()), recipe.steps, recipe.lr, loss_fn, objective)
    model.eval()
    adapter = draft_lora(model, data, mask_id, recipe, gen) if objective == "nld" else None
    return model, adapter


def draft_lora(model: torch.nn.Module, data: torch.Tensor, mask_id: int, recipe: Recipe, gen: torch.Generator
               ) -> dict[str, torch.Tensor]:
    """NLD's draft adapter: LoRA on every `o_proj`, trained with the base frozen on the diffusion loss of whole
    drafted blocks over the base's own greedy continuations, the tokens its verify pass accepts at temperature 0."""
    for param in model.parameters():
        param.requires_grad_(False)
    scale = recipe.lora_alpha / recipe.lora_rank
    weights: dict[str, torch.nn.Parameter] = {}
    handles = []
    for name, module in model.named_modules():
        if name.endswith("o_proj"):
            down = torch.nn.Parameter(torch.randn(recipe.lora_rank, module.in_features, generator=gen) / 50)
            up = torch.nn.Parameter(torch.zeros(module.out_features, recipe.lora_rank))
            weights[f"base_model.model.{name}.lora_A.weight"] = down
            weights[f"base_model.model.{name}.lora_B.weight"] = up
            handles.append(module.register_forward_hook(delta_hook(down, up, scale)))
    pool = greedy_rows(model, data, recipe, gen)

    def loss_fn():
        rows = pool[torch.randint(0, len(pool), (recipe.batch_size,), generator=gen)]
        return (nld_loss(model, rows, mask_id, recipe, gen, ar_rows=0, drafts=True)[1],)

    optimise(list(weights.values()), recipe.lora_steps, recipe.lr, loss_fn, "nld draft lora")
    for handle in handles:
        handle.remove()
    return {name: w.detach().clone() for name, w in weights.items()}


def save(model: torch.nn.Module, adapter: dict | None, path: Path, objective: str, recipe: Recipe) -> Path:
    """Write a bf16 checkpoint with its tokenizer and recipe; `nld` gets `dlm_type` and `linear_spec_lora/`, `wedlm`
    is dressed as WeDLM checkpoints ship (`scripts.make_tiny_models.as_wedlm`)."""
    path = Path(path)
    tokenizer = train_tokenizer()
    if objective in ("raven", "asarm"):
        model.to("cpu", torch.bfloat16).save_pretrained(path)
        tokenizer.save_pretrained(path)
        (path / "recipe.json").write_text(json.dumps({"objective": objective, **asdict(recipe)}, indent=1) + "\n")
        return path
    if objective == "nld":
        model.config.dlm_type = "llada"
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.to("cpu", torch.bfloat16).save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "recipe.json").write_text(json.dumps({"objective": objective, **asdict(recipe)}, indent=1) + "\n")
    if adapter is not None:
        lora_dir = path / "linear_spec_lora"
        lora_dir.mkdir(exist_ok=True)
        modules = sorted({k.split(".")[-3] for k in adapter})
        (lora_dir / "adapter_config.json").write_text(json.dumps({
            "peft_type": "LORA", "r": recipe.lora_rank, "lora_alpha": recipe.lora_alpha,
            "target_modules": modules, "bias": "none", "lora_dropout": 0.0,
        }, indent=1) + "\n")
        save_file({k: v.to("cpu", torch.bfloat16).contiguous() for k, v in adapter.items()},
                  lora_dir / "adapter_model.safetensors", metadata={"format": "pt"})
    if objective == "wedlm":
        as_wedlm(path, path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.train", description=__doc__.splitlines()[0])
    parser.add_argument("outdir")
    parser.add_argument("--objective", choices=OBJECTIVES, required=True)
    parser.add_argument("--init", type=Path, default=None, help="the `ar` checkpoint to start from (and distil)")
    parser.add_argument("--steps", type=int, default=None, help=f"default {DEFAULT_STEPS}")
    parser.add_argument("--seed", type=int, default=Recipe.seed)
    parser.add_argument("--device", default="cpu", help="results are deterministic per device and thread count")
    args = parser.parse_args()
    if args.objective not in FROM_SCRATCH and args.init is None:
        parser.error(f"--init (an `ar` checkpoint, e.g. from `python -m scripts.trained_models DIR`) is required "
                     f"for --objective {args.objective}")
    torch.set_num_threads(min(torch.get_num_threads(), 2))
    recipe = Recipe(steps=args.steps or DEFAULT_STEPS[args.objective], seed=args.seed)
    model, adapter = train(args.objective, recipe, args.init, args.device)
    print(f"saved {save(model, adapter, Path(args.outdir), args.objective, recipe)}")


if __name__ == "__main__":
    main()
