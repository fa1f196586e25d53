"""Under KV pressure vLLM preempts running requests and recomputes them later; with every method the requests
still give the tokens they give with room to spare (greedy, and seeded sampling for `wedlm` and `diffusion`), and
the engine keeps serving.

A preempted request keeps its decoder: the steps recomputing its KV commit nothing, as does a step that
schedules only part of a window (`vllm_plugin.commit`)."""

import pytest

from tests.support.vllm_engine import engine  # isort: split

from vllm import SamplingParams

from parallel_decoding.common.checkpoint import load
from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.methods import make_decoder, parse_config
from parallel_decoding.common.runner import ReferenceRunner
from parallel_decoding.common.sampling import SamplingParams as ReferenceSampling
from tests.support import ties

MAX_TOKENS = 96
SEED = 5
TIGHT_BLOCKS = 12  # of 32 tokens: room for about three of the requests at once
SPECS = [
    {"method": "wedlm", "window": 8, "entropy_threshold": 5.0, "distance_penalty": 0.02},
    {"method": "diffusion", "block_size": 8, "confidence_threshold": 0.3},
    {"method": "jacobi", "block_size": 4},
    {"method": "diffusion_self", "num_speculative_tokens": 4},
]


def temperatures(spec: dict) -> tuple[float, ...]:
    """Greedy and seeded for the commit methods. The lossless ones are verified by vLLM's rejection sampler,
    whose seeded stream a recompute step (one plain sample) advances differently: greedy only."""
    return (0.0,) if spec["method"] in ties.LOSSLESS else (0.0, 1.0)


def run(model_dir, spec: dict, prompts: list[str], **kwargs) -> tuple[list[list[int]], int]:
    """Greedy (and seeded) requests for every prompt, batched; their tokens and vLLM's preemption count."""
    params = [SamplingParams(temperature=t, seed=SEED, max_tokens=MAX_TOKENS, ignore_eos=True)
              for t in temperatures(spec)]
    with engine(model_dir, spec, max_num_seqs=16, max_model_len=256, **kwargs) as llm:
        outputs = llm.generate(prompts * len(params), [p for p in params for _ in prompts])
        preemptions = sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions")
    return [list(o.outputs[0].token_ids) for o in outputs], preemptions


def margins(model_dir, spec: dict, prompts: list[str]) -> list[list[float]]:
    """The reference runner's decision margins for each request (greedy ones; none tracked when sampled)."""
    model, tokenizer = load(model_dir)
    method = "ar" if spec["method"] in ties.LOSSLESS else spec["method"]
    settings = {} if method == "ar" else {k: v for k, v in spec.items() if k != "method"}
    config = parse_config(method, settings, mask_token_id=model.config.mask_token_id)
    greedy = [ReferenceRunner(model).run(make_decoder(method, config, tokenizer.encode(p), ReferenceSampling(),
                                                      Limits(MAX_TOKENS))).margins for p in prompts]
    return greedy + [[float("inf")] * MAX_TOKENS for _ in prompts] * (len(temperatures(spec)) - 1)


@pytest.mark.parametrize("spec", SPECS, ids=[s["method"] for s in SPECS])
def test_preempted_requests_give_the_roomy_tokens(engine_dir, prompts, spec):
    model_dir, prompts = engine_dir["qwen3"], prompts[:8]
    roomy, none = run(model_dir, spec, prompts)
    tight, preemptions = run(model_dir, spec, prompts, num_gpu_blocks_override=TIGHT_BLOCKS)
    assert none == 0 and preemptions >= 8
    assert all(len(tokens) == MAX_TOKENS for tokens in tight)
    ties.compare(tight, roomy, margins(model_dir, spec, prompts))


@pytest.mark.parametrize(("spec", "margin"), [(SPECS[0], 0), (SPECS[1], 1)], ids=["wedlm", "diffusion"])
def test_requests_up_to_the_model_length(engine_dir, prompts, spec, margin):
    """A request whose prompt and max_tokens fill the model length ends: windows stop short of the context (vLLM's
    model length, less the sampled token its scheduler keeps room for), as the reference decoder's with that
    context."""
    model_dir, prompts = engine_dir["qwen3"], prompts[:4]
    model, tokenizer = load(model_dir)
    config = parse_config(spec["method"], {k: v for k, v in spec.items() if k != "method"},
                          mask_token_id=model.config.mask_token_id)
    ids = [tokenizer.encode(p) for p in prompts]
    limits = [Limits(256 - len(i), context=256 - margin) for i in ids]
    expected = [ReferenceRunner(model).run(make_decoder(spec["method"], config, i, ReferenceSampling(), limit))
                for i, limit in zip(ids, limits, strict=True)]
    params = [SamplingParams(temperature=0, max_tokens=limit.max_tokens, ignore_eos=True) for limit in limits]
    with engine(model_dir, spec, max_model_len=256) as llm:
        got = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
    assert [len(tokens) for tokens in got] == [limit.max_tokens for limit in limits]
    ties.compare(got, [e.token_ids for e in expected], [e.margins for e in expected])


@pytest.mark.parametrize("spec", [SPECS[0], SPECS[2]], ids=["wedlm", "jacobi"])
def test_chunked_prefill_of_seeded_requests(engine_dir, prompts, spec):
    """Prompts longer than the step's token budget are prefilled in chunks, whose sampled tokens vLLM discards
    and whose seeded generators it rewinds: on CPU that used to kill the engine. Seeded requests give the tokens
    they give with room for whole prompts."""
    long_prompts = [" ".join(prompts[i : i + 6]) for i in range(0, 24, 6)]
    params = SamplingParams(temperature=1.0, seed=SEED, max_tokens=24, ignore_eos=True)

    def tokens(**kwargs) -> list[list[int]]:
        with engine(engine_dir["qwen3"], spec, max_model_len=256, **kwargs) as llm:
            return [list(o.outputs[0].token_ids) for o in llm.generate(long_prompts, params)]

    assert tokens(max_num_batched_tokens=48, max_num_seqs=4) == tokens()
