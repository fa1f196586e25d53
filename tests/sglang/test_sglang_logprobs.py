"""SGLang reports `return_logprob` with our modes as it does for AR decoding: each emitted token's log-probability
and the top-k equal the model's teacher-forced log-softmax over the request's temperature (1 for greedy, as
SGLang's sampler reports them), greedy and seeded requests batched with one asking for none; WeDLM's commit path
(its carried row), block diffusion's (its end settled in a reveal) and the lossless verify path. Logprobs of chosen
token ids (`token_ids_logprob`), which no mode reports, are refused. The prompt's (`logprob_start_len`) are SGLang's
own prefill's, the teacher-forced ones.

Runs in the SGLang environment (see `tests/sglang/test_sglang_server.py`)."""

import math

import pytest
import sglang
import torch

from parallel_decoding.common.checkpoint import load
from scripts.sglang_server import CPU_KWARGS, cpu_env

TOP = 3
MAX_TOKENS = 20
TOLERANCE = 1e-4
MODES = [
    ("wedlm", {"window": 4, "entropy_threshold": 3.0, "distance_penalty": 0.02}),
    ("diffusion", {"block_size": 4, "confidence_threshold": 0.3}),
    ("diffusion_self", {"num_speculative_tokens": 3}),
    pytest.param("diffusion_self", {"mode": "quadratic", "num_speculative_tokens": 3}, marks=pytest.mark.sweep),
    pytest.param("jacobi", {"block_size": 4, "pool_size": 4, "verification_size": 3}, marks=pytest.mark.sweep),
]


@pytest.fixture
def cpu_engine_env(monkeypatch):
    for name, value in cpu_env().items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize(("mode", "config"), MODES, ids=["wedlm", "diffusion", "diffusion_self", "quadratic",
                                                         "recycling"])
def test_logprobs_are_ar_logprobs(engine_dir, prompts, cpu_engine_env, mode, config):
    model, tokenizer = load(engine_dir["qwen3"])
    ids = [tokenizer.encode(prompt) for prompt in prompts[:8]]
    temperatures = [0.0] * 6 + [0.7, 0.0]
    asked = [True] * 7 + [False]
    params = [{"temperature": t, "max_new_tokens": MAX_TOKENS, "ignore_eos": True, "sampling_seed": 5}
              for t in temperatures]
    engine = sglang.Engine(model_path=str(engine_dir["qwen3"]), decode_mode=mode, decode_config=config,
                           **CPU_KWARGS)
    try:
        outputs = engine.generate(input_ids=ids, sampling_params=params, return_logprob=asked,
                                  top_logprobs_num=[TOP] * len(ids), logprob_start_len=[0] * len(ids))
        with pytest.raises(ValueError, match="token_ids_logprob is not supported"):
            engine.generate(input_ids=ids[0], sampling_params=params[0], return_logprob=True, token_ids_logprob=[5])
    finally:
        engine.shutdown()
    checked = 0
    for prompt, out, temperature, asks in zip(ids, outputs, temperatures, asked, strict=True):
        reported = out["meta_info"].get("output_token_logprobs")
        if not asks:
            assert not reported
            continue
        tokens = out["output_ids"]
        assert [token for _, token, _ in reported] == tokens and len(tokens) == MAX_TOKENS
        with torch.inference_mode():
            logits = model(torch.tensor([prompt + tokens])).logits[0].float()
        want = (logits / (temperature or 1.0)).log_softmax(-1)
        if not temperature:  # the prompt's, from SGLang's own prefill (which our modes leave as it is)
            given = out["meta_info"]["input_token_logprobs"]
            assert [token for _, token, _ in given] == prompt and given[0][0] is None
            torch.testing.assert_close(torch.tensor([value for value, _, _ in given[1:]]),
                                       want[: len(prompt) - 1].gather(-1, torch.tensor(prompt[1:])[:, None])[:, 0],
                                       atol=TOLERANCE, rtol=0)
        for j, ((logprob, token, _), top) in enumerate(zip(reported, out["meta_info"]["output_top_logprobs"],
                                                          strict=True)):
            row = want[len(prompt) + j - 1]
            assert math.isclose(logprob, float(row[token]), abs_tol=TOLERANCE), (j, logprob, float(row[token]))
            torch.testing.assert_close(torch.tensor([value for value, _, _ in top]), row.topk(TOP).values,
                                       atol=TOLERANCE, rtol=0)
            assert all(math.isclose(value, float(row[t]), abs_tol=TOLERANCE) for value, t, _ in top)
            checked += 1
    assert checked == 7 * MAX_TOKENS
