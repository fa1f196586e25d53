"""The OpenAI-compatible server answers 32 concurrent requests, streamed and not, exactly as the offline engine:
`diffusion_self` and `jacobi` as vLLM without speculation, `wedlm`, `diffusion` and `huginn` (on the trained Raven)
as the offline `LLM` with the same method (itself equal to `common/`'s reference); temperature 0, stop strings,
stop tokens, max_tokens."""

import functools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.vllm_engine import engine  # isort: split

import openai
from vllm import SamplingParams

from parallel_decoding.vllm_plugin.requests import ADJUSTMENTS
from scripts.vllm_server import metrics, vllm_server
from tests.support import ties
from tests.support.vllm_cases import MAX_TOKENS, STOP_AT

SERVED = [
    {"method": "diffusion_self", "num_speculative_tokens": 4, "adaptive": False},
    {"method": "jacobi", "block_size": 4, "step_cost": [1.0, 0.0, 0.0]},  # rows free: the full width
    {"method": "wedlm", "window": 8, "entropy_threshold": 5.0},
    {"method": "diffusion", "block_size": 8, "confidence_threshold": 0.1},
    {"method": "huginn", "sampler": "wavefront", "num_steps": 32, "inner_recurrence": 4},
]
LOSSLESS = {"diffusion_self", "jacobi"}
TRAINED_RAVEN = Path(__file__).resolve().parents[2] / "scripts" / "trained" / "raven"


def model_dir(engine_dir, spec: dict) -> Path:
    """Huginn serves Raven checkpoints (the trained one, whose latents converge); the others the tiny Qwen3."""
    return TRAINED_RAVEN if spec["method"] == "huginn" else engine_dir["qwen3"]


# CI serves `jacobi` (lossless), `wedlm` (committing) and `huginn` (its own worker); `diffusion_self` and `diffusion`,
# whose engine paths those share and whose offline equality tests run in CI, as sweeps.
@pytest.fixture(scope="module", params=[pytest.param(s, marks=[pytest.mark.sweep] if s["method"] in (
    "diffusion_self", "diffusion") else [], id=s["method"]) for s in SERVED])
def spec(request):
    return request.param


@pytest.fixture(scope="module")
def cases(engine_dir, prompts, spec):
    """(prompt, request extras, expected text, expected completion tokens, whether the reference decoding of the
    prompt takes a near-tied decision) from the offline oracle engine."""
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    with engine(model_dir(engine_dir, spec), None if spec["method"] in LOSSLESS else spec) as llm:
        first = llm.generate(prompts, greedy)
        requests = []
        for prompt, out in zip(prompts, first, strict=True):
            requests.append((prompt, {}))
            requests.append((prompt, {"stop": [out.outputs[0].text[-12:-8]]}))
            requests.append((prompt, {"extra_body": {"stop_token_ids": [out.outputs[0].token_ids[STOP_AT]]}}))
        params = [
            SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop=extra.get("stop"),
                           stop_token_ids=extra.get("extra_body", {}).get("stop_token_ids"))
            for _, extra in requests
        ]
        outs = llm.generate([p for p, _ in requests], params)
    settings = {k: v for k, v in spec.items() if k != "method"}
    tied = ties.reference_ties(model_dir(engine_dir, spec), spec["method"], settings, prompts, MAX_TOKENS)
    return [
        (prompt, extra, out.outputs[0].text, len(out.outputs[0].token_ids), tied[i // 3] is not None)
        for i, ((prompt, extra), out) in enumerate(zip(requests, outs, strict=True))
    ]


@pytest.fixture(scope="module")
def server(spec, engine_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "log.txt"
    with vllm_server(model_dir(engine_dir, spec), spec, log_path=log) as client:
        yield client


def complete(client: openai.OpenAI, prompt: str, extra: dict) -> tuple[str, int]:
    out = client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, **extra)
    return out.choices[0].text, out.usage.completion_tokens


def stream(client: openai.OpenAI, prompt: str, extra: dict) -> tuple[str, int]:
    chunks = client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                       stream=True, stream_options={"include_usage": True}, **extra)
    text, used = "", 0
    for chunk in chunks:
        text += "".join(c.text for c in chunk.choices)
        if chunk.usage is not None:
            used = chunk.usage.completion_tokens
    return text, used


@pytest.mark.parametrize("call", [complete, stream], ids=["plain", "streaming"])
def test_concurrent_requests_equal_no_speculation(server, cases, call):
    with ThreadPoolExecutor(32) as pool:
        got = list(pool.map(lambda case: call(server, case[0], case[1]), cases))
    ties.compare_untied(got, [(text, tokens) for _, _, text, tokens, _ in cases], [tie for *_, tie in cases])
    assert sum(tokens < MAX_TOKENS for _, _, _, tokens, _ in cases) >= len(cases) // 3


def test_metrics_endpoint_reports_acceptance(server):
    """After the requests above, /metrics carries vLLM's per-position acceptance for our method."""
    samples = metrics(server)
    drafts = [v for k, v in samples.items() if k.startswith("vllm:spec_decode_num_drafts_total")]
    accepted = [v for k, v in samples.items() if k.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total")]
    assert drafts and drafts[0] > 0
    assert accepted and accepted[0] > 0


REFUSED = [("logprobs", {"logprobs": 2}), ("presence_penalty", {"presence_penalty": 0.5}),
           ("frequency_penalty", {"frequency_penalty": 0.5}), ("logit_bias", {"logit_bias": {"5": 3}}),
           ("repetition_penalty", {"extra_body": {"repetition_penalty": 1.3}}),
           ("min_p", {"extra_body": {"min_p": 0.1}}), ("min_tokens", {"extra_body": {"min_tokens": 3}}),
           ("prompt_logprobs", {"extra_body": {"prompt_logprobs": 1}}),
           ("structured_outputs", {"extra_body": {"structured_outputs": {"regex": "[a-z]+"}}}),
           ("allowed_token_ids", {"extra_body": {"allowed_token_ids": [5, 6]}}),
           ("bad_words", {"extra_body": {"bad_words": ["def"]}})]


def test_unapplied_options_refused_by_name(server, spec, cases):
    """`wedlm`, `diffusion` and `huginn` refuse, with a 400 naming it, every per-request option their decoders would
    not apply (sampled requests: greedy ones make vLLM drop min_p), and keep serving; `logprobs` they report, and
    `prompt_logprobs` all but `wedlm` (whose prefill emits no token); the penalties, `allowed_token_ids`,
    `logit_bias` and `min_p` the `wedlm` and `diffusion` decoders apply (`common.penalties`, `common.sampling`). The
    lossless methods leave them to vLLM, whose rejection sampler applies them, but for min_p and logit_bias, which
    vLLM refuses with any speculation and which they apply to the target's logits (`PluginProposer.adjust_targets`)."""
    prompt, _, text, _, _ = cases[0]
    for name, extra in REFUSED:
        create = functools.partial(server.completions.create, model="tiny", prompt=prompt, max_tokens=4,
                                   temperature=0.7, seed=1, **extra)
        if spec["method"] in LOSSLESS:
            if name not in ("structured_outputs", "prompt_logprobs"):
                create()
            continue
        if name in ADJUSTMENTS:  # applied (test_vllm_commit_methods, test_vllm_huginn)
            create()
            continue
        if name == "logprobs":  # reported (tests/vllm/test_vllm_logprobs.py, tests/vllm/test_vllm_huginn.py)
            out = create()
            reported = out.choices[0].logprobs
            assert len(reported.token_logprobs) == out.usage.completion_tokens
            assert all(-9999 < lp <= 0 for lp in reported.token_logprobs) and all(reported.top_logprobs)
            continue
        if name == "prompt_logprobs" and spec["method"] != "wedlm":  # the causal prefill's rows (same tests)
            out = create()
            assert len(out.choices[0].prompt_logprobs) == out.usage.prompt_tokens
            continue
        with pytest.raises(openai.BadRequestError, match=name):
            create()
    assert complete(server, prompt, {})[0] == text  # still serving
