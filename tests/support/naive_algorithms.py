"""From-scratch greedy versions of the approximate methods, written straight from the papers.

No cache, no state machine: every step forwards the whole sequence. They share nothing with `common/` but
the model, so a bookkeeping bug in the decoders cannot hide in both.
"""

import torch

NEG = torch.finfo(torch.float32).min


@torch.inference_mode()
def forward(model, ids: list[int], positions: list[int], visible: torch.Tensor) -> torch.Tensor:
    mask = torch.zeros(visible.shape).masked_fill(~visible, NEG)[None, None]
    out = model(input_ids=torch.tensor([ids]), position_ids=torch.tensor([positions]), attention_mask=mask)
    return out.logits[0].float()


def causal(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()


def entropy(logits: torch.Tensor) -> torch.Tensor:
    logp = logits.log_softmax(-1)
    return -(logp.exp() * logp).sum(-1)


def wedlm(model, prompt, mask_id, window, tau, lam, max_tokens, eos=()):
    """WeDLM Algorithm 1 (seed 003), greedy, recomputing the committed prefix each step; W slots to the end,
    as the upstream engine keeps them."""
    out: list[int] = []
    slots: list[int | None] = []
    while True:
        lead = next((i for i, t in enumerate(slots) if t is None), len(slots))
        slots += [None] * max(window + lead - len(slots), 0)
        order = [i for i, t in enumerate(slots) if t is not None] + [i for i, t in enumerate(slots) if t is None]
        seq = prompt + out
        ids = seq + [mask_id if slots[i] is None else slots[i] for i in order]
        logits = forward(model, ids, list(range(len(seq))) + [len(seq) + i for i in order], causal(len(ids)))
        row = {slot: len(seq) + k for k, slot in enumerate(order)}
        committed, slots = slots[:lead], slots[lead:]
        out += committed
        hit = [i for i, t in enumerate(out) if t in eos]
        if hit or len(out) >= max_tokens:
            return out[: hit[0] + 1] if hit else out[:max_tokens]
        masks = [i for i, t in enumerate(slots) if t is None]
        if not masks:
            continue
        mask_logits = torch.stack([logits[row[m + lead]] for m in masks])
        adjusted = entropy(mask_logits) + lam * torch.tensor([m - masks[0] for m in masks], dtype=torch.float32)
        chosen = [m for m, a in zip(masks, adjusted.tolist(), strict=True) if tau is not None and a < tau]
        chosen = chosen or [masks[int(adjusted.argmin())]]
        for m in chosen:
            slots[m] = int(logits[row[m + lead]].argmax())


def block_diffusion(model, prompt, mask_id, block, tau, max_tokens, eos=(), shifted=False):
    """NLD block diffusion (seed 001, sec. 3.2), greedy, recomputing everything each step.

    A mask row predicts its own slot (NLD's `llada` checkpoints), or the next one when `shifted` (`dream`).
    """
    seq = list(prompt)
    seq.append(int(forward(model, seq, list(range(len(seq))), causal(len(seq)))[-1].argmax()))
    while True:
        out = seq[len(prompt) :]
        if any(t in eos for t in out) or len(out) >= max_tokens:
            hit = [i for i, t in enumerate(out) if t in eos]
            return out[: hit[0] + 1] if hit else out[:max_tokens]
        size = block - 1
        blk, masked = [seq[-1]] + [mask_id] * size, [False] + [True] * size
        prefix = seq[:-1]
        while any(masked):
            n = len(prefix) + len(blk)
            visible = causal(n)
            visible[len(prefix) :, len(prefix) :] = True
            first = len(prefix) + (0 if shifted else 1)
            logits = forward(model, prefix + blk, list(range(n)), visible)[first : first + len(blk) - 1].clone()
            logits[:, mask_id] = NEG
            conf, cand = logits.softmax(-1).max(-1)
            conf = torch.where(torch.tensor(masked[1:]), conf, torch.tensor(-1.0))
            pick = (conf >= tau).tolist()
            pick[int(conf.argmax())] = True
            for j, p in enumerate(pick):
                if p and masked[j + 1]:
                    blk[j + 1], masked[j + 1] = int(cand[j]), False
        seq = prefix + blk
        revealed = blk[1:]
        if any(t in eos for t in revealed) or len(out) + len(revealed) >= max_tokens:
            continue
        seq.append(int(forward(model, seq, list(range(len(seq))), causal(len(seq)))[-1].argmax()))
