"""vLLM with `jacobi` rejection recycling (`pool_size` > 0, `recycling: linear`: the newest pool candidate is the
step's one linear draft). On a model whose greedy output walks cycles, 8 requests in one batch return greedy AR's
tokens and the pool lifts tokens per forward well above plain Jacobi's; with one block, vLLM's acceptance counters
are the reference runner's (with two, vLLM verifies the pseudo-active block's drafts too, the reference does not)."""

import pytest

from tests.support.vllm_engine import engine  # isort: split

from vllm import SamplingParams, TokensPrompt

from parallel_decoding.common.acceptance import AcceptanceStats
from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.methods import make_decoder, parse_config
from parallel_decoding.common.runner import ReferenceRunner
from parallel_decoding.common.sampling import SamplingParams as ReferenceSampling
from parallel_decoding.vllm_plugin.metrics import acceptance
from tests.support.vllm_cases import summed

MAX_TOKENS = 64
SETTINGS = {"block_size": 16, "spawn_ratio": 0.85, "pool_size": 4, "recycling": "linear"}


def reference(model, settings: dict | None, prompt: list[int]):
    method = "ar" if settings is None else "jacobi"
    config = None if settings is None else parse_config("jacobi", settings)
    decoder = make_decoder(method, config, prompt, ReferenceSampling(), Limits(MAX_TOKENS))
    return ReferenceRunner(model).run(decoder), decoder.acceptance


def tokens_per_forward(stats: AcceptanceStats) -> float:
    """Committed tokens per verify forward: each draft is one forward giving its accepted tokens and one more."""
    return (sum(stats.accepted_per_position) + stats.num_drafts) / stats.num_drafts


@pytest.mark.parametrize("num_blocks", [1, 2])
def test_recycling_equals_ar_and_earns_its_forwards(cyclic, num_blocks):
    path, model, prompts = cyclic
    settings = {**SETTINGS, "num_blocks": num_blocks}
    ar = [reference(model, None, p)[0].token_ids for p in prompts]
    plain = summed([reference(model, {**settings, "pool_size": 0}, p)[1] for p in prompts])
    want = summed([reference(model, settings, p)[1] for p in prompts])
    with engine(path, {"method": "jacobi", "adaptive": False, **settings}, skip_tokenizer_init=True) as llm:
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                               SamplingParams(temperature=0, max_tokens=MAX_TOKENS, detokenize=False),
                               use_tqdm=False)
        got = acceptance(llm)
    assert [list(o.outputs[0].token_ids) for o in outputs] == ar
    assert got == want or num_blocks > 1
    assert tokens_per_forward(got) >= 1.5, got
    assert tokens_per_forward(got) >= tokens_per_forward(plain) + 0.4, (plain, got)
