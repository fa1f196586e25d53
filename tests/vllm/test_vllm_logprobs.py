"""vLLM reports `logprobs` for the methods whose own rule commits (`wedlm`, `diffusion`, quadratic
`diffusion_self`) as AR decoding reports them for the same tokens: each returned token's log-probability, its
rank and the top-k equal the model's teacher-forced distribution given the tokens before it, greedy and seeded
requests batched, and `prompt_logprobs` as AR's prefill reports them (refused for `wedlm`). `jacobi` (vLLM's
rejection sampler reports them) is held to the same."""

import math

import pytest
import torch

from tests.support.vllm_engine import engine  # isort: split

from vllm import SamplingParams

from parallel_decoding.common.checkpoint import load

TOP = 3
MAX_TOKENS = 24
TOLERANCE = 1e-4
SPECS = [
    {"method": "wedlm", "window": 4, "entropy_threshold": 3.0, "distance_penalty": 0.02},
    {"method": "diffusion", "block_size": 4, "confidence_threshold": 0.3},
    {"method": "diffusion_self", "mode": "quadratic", "num_speculative_tokens": 3},
    {"method": "jacobi", "block_size": 4},
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.get("mode", s["method"]))
def test_logprobs_are_ar_logprobs(engine_dir, prompts, spec):
    model, _ = load(engine_dir["qwen3"])
    prompted = spec["method"] != "wedlm"  # whose prefill emits no token: vLLM has no step to report its prompt's in
    params = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=TOP)] * 5
    params += [SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=TOP,
                              prompt_logprobs=TOP if prompted else None)]
    params += [SamplingParams(temperature=1.0, seed=7, max_tokens=MAX_TOKENS, logprobs=TOP + 2,
                              prompt_logprobs=1 if prompted else None)]
    params += [SamplingParams(temperature=0, max_tokens=MAX_TOKENS)]  # batched with a request asking for none
    with engine(engine_dir["qwen3"], spec) as llm:
        outputs = llm.generate(prompts[: len(params)], params)
        if not prompted:
            from vllm.exceptions import VLLMValidationError

            with pytest.raises(VLLMValidationError, match="prompt_logprobs"):
                llm.generate(prompts[0], SamplingParams(max_tokens=4, prompt_logprobs=1))
    checked = 0
    for out, param in zip(outputs, params, strict=True):
        completion = out.outputs[0]
        if param.logprobs is None:
            assert completion.logprobs is None
            continue
        tokens = list(out.prompt_token_ids) + list(completion.token_ids)
        with torch.inference_mode():
            ar = model(torch.tensor([tokens])).logits[0].float().log_softmax(-1)
        assert len(completion.logprobs) == len(completion.token_ids) > 0
        if param.prompt_logprobs is None:
            assert out.prompt_logprobs is None
        else:  # the prefill's rows, as AR's prefill reports them
            assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(out.prompt_token_ids)
            for j, (token, reported) in enumerate(zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:],
                                                      strict=True)):
                assert token in reported and len(reported) <= param.prompt_logprobs + 1
                for candidate, logprob in reported.items():
                    assert math.isclose(logprob.logprob, float(ar[j][candidate]), abs_tol=TOLERANCE), (j, candidate)
        for j, (token, reported) in enumerate(zip(completion.token_ids, completion.logprobs, strict=True)):
            want = ar[len(out.prompt_token_ids) + j - 1]
            assert token in reported and len(reported) <= param.logprobs + 1
            for candidate, logprob in reported.items():
                assert math.isclose(logprob.logprob, float(want[candidate]), abs_tol=TOLERANCE), (j, candidate)
            top = sorted((lp.logprob for t, lp in reported.items() if lp.rank <= param.logprobs), reverse=True)
            torch.testing.assert_close(torch.tensor(top), want.topk(param.logprobs).values, atol=TOLERANCE, rtol=0)
            lp = float(want[token])
            assert (want > lp + TOLERANCE).sum() + 1 <= reported[token].rank <= (want > lp - TOLERANCE).sum() + 1
            checked += 1
    assert checked >= 7 * MAX_TOKENS // 2
