"""`common.logprob_rows`: for every token a committing method (and Jacobi, with recycled branches or several
blocks) commits, the row it names (in the committing forward, or carried from an earlier one) sees exactly the
tokens before that token, as AR decoding's row does, and its logits are AR's: checked on the attention pattern
itself and on the logits, greedy and sampled. The one gap: the tokens block diffusion settles at a request's end
in a bidirectional reveal forward."""

import pytest
import torch

from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.logprob_rows import logprob_rows
from parallel_decoding.common.methods import make_decoder, parse_config
from parallel_decoding.common.runner import ReferenceRunner
from parallel_decoding.common.sampling import SamplingParams
from parallel_decoding.common.window import Attention, Forward

MAX_TOKENS = 23
METHODS = [
    ("wedlm", {"window": 6, "entropy_threshold": 3.0, "distance_penalty": 0.05}),
    ("wedlm", {"window": 4, "entropy_threshold": None}),
    ("diffusion", {"block_size": 5, "confidence_threshold": 0.3}),
    ("diffusion_self_quadratic", {"block_size": 4}),
    ("jacobi", {"block_size": 4, "pool_size": 4, "verification_size": 3}),
    ("jacobi", {"block_size": 3, "num_blocks": 2, "spawn_ratio": 0.5}),
]


class AllRows(ReferenceRunner):
    """The reference runner, keeping the logits of every row of every forward (as an engine computes them)."""

    def logits(self, forward: Forward, decoder, cache) -> torch.Tensor:
        every = Forward(forward.token_ids, forward.positions, torch.arange(forward.num_tokens), forward.attention,
                        forward.mask, forward.adapter)
        self.rows.append(super().logits(every, decoder, cache))
        return self.rows[-1][forward.logit_rows]


def seen(forward: Forward, row: int, prefix: int) -> list[tuple[int, int]]:
    """(position, token) of what `row` attends to: the cached prefix's positions and the forwarded rows."""
    visible = forward.visibility()[row].nonzero().flatten().tolist()
    return sorted([(p, -1) for p in range(prefix)] + [(int(forward.positions[i]), int(forward.token_ids[i]))
                                                      for i in visible])


def check(model, prompts: list[list[int]], method: str, settings: dict, sampling: SamplingParams
          ) -> tuple[int, int]:
    """Decode each prompt, checking every committed token's named row; the number of tokens checked, and of those
    whose row is not the first at its position (a recycled branch's)."""
    config = parse_config(method, settings, mask_token_id=getattr(model.config, "mask_token_id", None))
    checked = later = 0
    for prompt in prompts:
        decoder = make_decoder(method, config, prompt, sampling, Limits(MAX_TOKENS))
        runner = AllRows(model)
        runner.rows = []
        found: list[tuple[Forward, int, int, torch.Tensor] | None] = []  # per token: forward, row, prefix, logits
        carried, prefix = None, 0
        for step in runner.steps(decoder):
            committed = len(step.outcome.committed)
            named = logprob_rows(step.forward, decoder.tokens, decoder.num_tokens - committed, committed)
            for j, row in enumerate(named.rows):
                if row is not None:
                    found.append((step.forward, row, prefix, runner.rows[-1][row]))
                    positions = step.forward.positions.tolist()
                    later += positions.index(positions[row]) != row
                elif j == 0 and carried is not None:
                    found.append(carried)
                else:  # only block diffusion's end, settled in a reveal forward (engines forward it causally)
                    assert method == "diffusion" and step.forward.attention is Attention.BIDIRECTIONAL
                    assert decoder.finished
                    found.append(None)
            if named.next_row is not None:
                carried = (step.forward, named.next_row, prefix, runner.rows[-1][named.next_row])
            elif committed:
                carried = None
            prefix = decoder.cache_len
        tokens = prompt + decoder.output
        with torch.inference_mode():
            ar = model(torch.tensor([tokens])).logits[0].float().log_softmax(-1)
        assert len(found) == len(decoder.output)
        for j, entry in enumerate(found):
            if entry is None:
                continue
            forward, row, cached, logits = entry
            q = len(prompt) + j
            assert seen(forward, row, cached) == [(p, -1 if p < cached else tokens[p]) for p in range(q)]
            torch.testing.assert_close(logits.log_softmax(-1), ar[q - 1], atol=1e-4, rtol=0)
            checked += 1
    return checked, later


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=1.0, seed=5)],
                         ids=["greedy", "sampled"])
@pytest.mark.parametrize(("method", "settings"), METHODS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(METHODS)])
def test_named_rows_are_ar_rows(qwen3, method, settings, sampling):
    model, tokenizer = qwen3
    prompts = [tokenizer.encode(t) for t in ["def wrap(text, width=70):", "import os", "class Random(_random.Random):"]]
    assert check(model, prompts, method, settings, sampling)[0] >= 3 * 5


def test_recycled_branches_name_their_own_rows(cyclic):
    """On a model whose output repeats, recycled branches win: their rows, not the main draft's at the same
    positions, are AR's for what they commit."""
    _, model, prompts = cyclic
    checked, branch_rows = check(model, prompts, "jacobi", {"block_size": 4, "pool_size": 4, "verification_size": 3},
                                 SamplingParams())
    assert checked == MAX_TOKENS * len(prompts) and branch_rows > 0
