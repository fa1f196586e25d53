"""The tiny-vocabulary sampling setting whose exact joint every engine's sampling test compares against."""

import torch

from parallel_decoding.common.runner import ReferenceRunner
from parallel_decoding.common.sampling import SamplingParams, target_probs

VOCAB, MASK, LENGTH, SAMPLES = 8, 7, 3, 3000
PROMPT = [1, 2, 3]
P_VALUE_FLOOR = 1e-4
# WeDLM-drafted speculation drafts only after its first decode step: a 4-token continuation verifies drafts.
SPEC_CASE, SPEC_LENGTH = ("wedlm_spec", {"window": 3}), 4
PARAMS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_p=0.8)]


@torch.inference_mode()
def exact_joint(model, params: SamplingParams, length: int = LENGTH) -> dict[tuple[int, ...], float]:
    """P(continuation) for every continuation of `length` tokens, multiplying the processed per-step
    distributions: one batched forward per step over every prefix (of equal length, so no padding)."""
    joint: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(length):
        prefixes = list(joint)
        logits = model(input_ids=torch.tensor([PROMPT + list(prefix) for prefix in prefixes])).logits[:, -1]
        probs = target_probs(logits, params).double().tolist()
        joint = {prefix + (token,): joint[prefix] * row[token]
                 for prefix, row in zip(prefixes, probs, strict=True) for token in range(VOCAB)}
    return joint


def chi_square_p_value(counts: dict, joint: dict) -> float:
    """Pearson's test, cells with expected count < 5 pooled; an impossible outcome gives p = 0."""
    if any(joint.get(k, 0.0) == 0.0 for k in counts):
        return 0.0
    stat, pooled_obs, pooled_exp, cells = 0.0, 0, 0.0, 0
    total = sum(counts.values())
    for key, prob in joint.items():
        expected, observed = prob * total, counts.get(key, 0)
        if expected < 5:
            pooled_obs, pooled_exp = pooled_obs + observed, pooled_exp + expected
            continue
        stat += (observed - expected) ** 2 / expected
        cells += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        cells += 1
    dof = torch.tensor((cells - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, torch.tensor(stat / 2, dtype=torch.float64)))



class MemoRunner(ReferenceRunner):
    """The reference runner recomputing each forward from scratch, every distinct forward (prefix, window, positions,
    visibility, rows, adapter) run once: thousands of seeded decodes on a tiny vocabulary repeat a few hundred
    forwards, and the model gives the same logits for the same input."""

    def __init__(self, model) -> None:
        super().__init__(model, use_cache=False)
        self.memo: dict[tuple, torch.Tensor] = {}

    def logits(self, forward, decoder, cache) -> torch.Tensor:
        tensors = (forward.token_ids, forward.positions, forward.visibility(), forward.logit_rows, forward.adapter_rows)
        key = (tuple(decoder.tokens[:decoder.cache_len]), forward.adapter,
               *(None if t is None else t.numpy().tobytes() for t in tensors))
        if key not in self.memo:
            self.memo[key] = super().logits(forward, decoder, cache)
        return self.memo[key].clone()


def memo_conditionals(conditionals):
    """ASSD's `conditionals` (logits of target positions given the ranked ones), each distinct call run once."""
    memo: dict[tuple, torch.Tensor] = {}

    def memoized(model, ids, ranks, given, targets):
        key = (tuple(ids), ranks.numpy().tobytes(), given.numpy().tobytes(), tuple(targets))
        if key not in memo:
            memo[key] = conditionals(model, ids, ranks, given, targets)
        return memo[key].clone()

    return memoized


def memo_recurrent_forwards(run_forward):
    """Huginn's `run_forward`, each distinct request history (its forwards so far, in order) run once. A cache that
    missed forwards served from the memo is rebuilt by replaying its request's history before the next miss runs."""
    memo: dict[tuple, object] = {}

    def key(forward) -> tuple:
        tensors = (forward.token_ids, forward.latents, forward.previous_embeds)
        return (forward.start, forward.inner, forward.first_recurrence, forward.ema,
                *(None if t is None else t.numpy().tobytes() for t in tensors))

    def memoized(model, cache, forward):
        history = cache.__dict__.setdefault("memo_history", [])
        history.append(forward)
        path = tuple(key(f) for f in history)
        if path not in memo:
            if cache.__dict__.get("memo_applied", 0) != len(history) - 1:
                cache.keys.clear(), cache.values.clear()
                cache.length = 0
                for earlier in history[:-1]:
                    run_forward(model, cache, earlier)
            memo[path] = run_forward(model, cache, forward)
            cache.memo_applied = len(history)
        out = memo[path]
        return type(out)(*(t.clone() for t in (out.latents, out.logits, out.embeds)))

    return memoized
