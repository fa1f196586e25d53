"""The tiny-vocabulary sampling setting whose exact joint every engine's sampling test compares against."""

import torch

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

