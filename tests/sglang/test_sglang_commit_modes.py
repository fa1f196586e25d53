"""SGLang with `--decode-mode wedlm`, `diffusion` and `diffusion_self` in mode quadratic returns exactly the tokens of
`parallel-decoding generate` with the same method, config and seed, greedy and sampled, 16 prompts each (48 requests
in flight); stop tokens and max_tokens end a request inside a window as the reference decoder ends it; the KV the
modes commit, reused through SGLang's radix cache, continues as a fresh prefill would; the OpenAI endpoints
(completions with stop strings, streaming, chat) give the text `/generate` gives, and logprobs; the penalties and
`logit_bias`, and `min_new_tokens`, give the reference runner's tokens under them; a setting the modes do not apply
(a watermark) is refused per request with a 400.

Runs in the SGLang environment (see `tests/sglang/test_sglang_server.py`)."""

import json
import urllib.error
from concurrent.futures import ThreadPoolExecutor

import pytest

from parallel_decoding.common.checkpoint import load
from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.methods import make_decoder, parse_config
from parallel_decoding.common.runner import ReferenceRunner, Result
from parallel_decoding.common.sampling import SamplingParams
from scripts.sglang_server import sglang_server
from tests.support import ties
from tests.support.reference_cli import (
    HELD,
    MAX_TOKENS,
    SEED,
    SGLANG_ADJUSTED,
    SGLANG_REFERENCE_ADJUSTED,
    adjusted_reference,
    held_reference,
    reference,
    settings,
)
from tests.support.sglang_client import generate

STOP_AT = 9
SPECS = [
    {"method": "wedlm", "window": 4, "entropy_threshold": 0.4, "distance_penalty": 0.02},
    {"method": "wedlm", "window": 8, "entropy_threshold": 5.0, "distance_penalty": 0.02},
    {"method": "diffusion", "block_size": 4, "confidence_threshold": 0.5},
    {"method": "diffusion", "block_size": 8, "confidence_threshold": 0.1},
    {"method": "diffusion_self", "mode": "quadratic", "num_speculative_tokens": 3},
]
WIDTH = 8  # the widest window or block above


def stop_cases(model_dir, spec: dict, prompts: list[str]) -> list[tuple[str, dict, Result]]:
    """(prompt, SGLang sampling params, the reference decoder's result): a stop token taken from inside the
    output, and max_tokens 7, both greedy."""
    model, tokenizer = load(model_dir)
    config = parse_config(spec["method"], json.loads(settings(spec)), mask_token_id=model.config.mask_token_id)
    runner = ReferenceRunner(model)
    cases = []

    def run(ids: list[int], limits: Limits):
        return runner.run(make_decoder(spec["method"], config, ids, SamplingParams(), limits))

    for prompt in prompts:
        ids = tokenizer.encode(prompt)
        eos = run(ids, Limits(MAX_TOKENS)).token_ids[STOP_AT]
        cases += [(prompt, {"stop_token_ids": [eos]}, run(ids, Limits(MAX_TOKENS, (eos,)))),
                  (prompt, {"max_new_tokens": 7}, run(ids, Limits(7)))]
    return cases


def continuation(client, model_dir, spec: dict, prompts: list[str], outputs: list[dict]) -> bool:
    """The KV a mode committed, reused through SGLang's radix cache: prompt + output sent again as a prompt hits
    the cache for all of it and continues as the reference decoder continues from a fresh prefill."""
    model, tokenizer = load(model_dir)
    config = parse_config(spec["method"], json.loads(settings(spec)), mask_token_id=model.config.mask_token_id)
    got, want = [], []
    for prompt, out in zip(prompts, outputs, strict=True):
        ids = tokenizer.encode(prompt) + out["output_ids"]
        again = generate(client, ids, max_new_tokens=8, ignore_eos=True)
        decoder = make_decoder(spec["method"], config, ids, SamplingParams(), Limits(8))
        got.append(again["output_ids"])
        want.append(ReferenceRunner(model).run(decoder))
        assert again["meta_info"]["cached_tokens"] >= len(ids) - 1
    ties.compare(got, [w.token_ids for w in want], [w.margins for w in want])
    return True


@pytest.mark.parametrize("spec", [SPECS[0], pytest.param(SPECS[1], marks=pytest.mark.sweep), SPECS[2],
                                  pytest.param(SPECS[3], marks=pytest.mark.sweep), SPECS[4]], ids=lambda s: "-".join(
                                      f"{v}" for v in s.values()))
def test_equals_reference(engine_dir, prompts, tmp_path, spec):
    model, prompts = engine_dir["qwen3"], prompts[:16]
    expected = {t: reference(model, spec, prompts, tmp_path, t) for t in (0.0, 1.0)}
    longer = reference(model, spec, prompts, tmp_path, 0.0, MAX_TOKENS + 2 * WIDTH)
    stops = stop_cases(model, spec, prompts[:8]) if spec["method"] != "diffusion_self" else []
    # greedy and sampled requests batched together, and greedy ones asking for 2W more tokens
    requests = [(p, t, MAX_TOKENS) for t in expected for p in prompts] + [(p, 0.0, MAX_TOKENS + 2 * WIDTH)
                                                                          for p in prompts]
    with sglang_server(model, spec["method"], settings(spec)) as client, ThreadPoolExecutor(len(requests)) as pool:
        outputs = list(pool.map(lambda r: generate(client, r[0], temperature=r[1], sampling_seed=SEED,
                                                   max_new_tokens=r[2]), requests))
        stopped = list(pool.map(lambda case: generate(client, case[0], **case[1])["output_ids"], stops))
        continued = continuation(client, model, spec, prompts[:4], outputs[:4])
    want = [*expected[0.0][0], *expected[1.0][0], *longer[0]]
    ties.compare([out["output_ids"] for out in outputs], want, [*expected[0.0][1], *expected[1.0][1], *longer[1]])
    assert [tokens[:MAX_TOKENS] for tokens in longer[0]] == expected[0.0][0]  # max_tokens changes no token
    ties.compare(stopped, [r.token_ids for _, _, r in stops], [r.margins for _, _, r in stops])
    assert continued
    assert any(len(r.token_ids) < MAX_TOKENS and len(r.token_ids) != 7 for _, _, r in stops) or not stops


# sampling parameters the commit modes' decoders would not apply, each refused with a 400 naming it (structured output,
# min-p and `min_new_tokens` they apply: `test_sglang_structured_output.py`, `test_sglang_sampling.py`, and below)
UNAPPLIED = [("watermark", {"enabled": True})]


@pytest.mark.parametrize("spec", [SPECS[0], pytest.param(SPECS[2], marks=pytest.mark.sweep)],
                         ids=["wedlm", "diffusion"])
def test_openai_endpoints_give_the_generate_text(engine_dir, prompts, spec):
    model = engine_dir["qwen3"]
    _, tokenizer = load(model)
    chats = [[{"role": "user", "content": p}] for p in prompts[:8]]
    stop_tokens, held_tokens, held_margins = held_reference(model, spec, prompts[:4])
    with sglang_server(model, spec["method"], settings(spec)) as client, ThreadPoolExecutor(8) as pool:
        full = [out["text"] for out in pool.map(lambda p: generate(client, p), prompts[:8])]
        stops = [text[len(text) // 2 : len(text) // 2 + 3] for text in full]
        stopped = list(pool.map(lambda ps: client.completions.create(
            model="tiny", prompt=ps[0], max_tokens=MAX_TOKENS, temperature=0, stop=[ps[1]]).choices[0],
            zip(prompts, stops, strict=False)))
        streamed = list(pool.map(lambda p: "".join(chunk.choices[0].text for chunk in client.completions.create(
            model="tiny", prompt=p, max_tokens=MAX_TOKENS, temperature=0, stream=True)), prompts[:8]))
        chatted = list(pool.map(lambda m: client.chat.completions.create(
            model="tiny", messages=m, max_tokens=MAX_TOKENS, temperature=0).choices[0].message.content, chats))
        templated = list(pool.map(lambda m: generate(client, tokenizer.apply_chat_template(
            m, tokenize=False, add_generation_prompt=True))["text"], chats))
        reported = client.completions.create(model="tiny", prompt=prompts[0], max_tokens=4, temperature=0,
                                             logprobs=2).choices[0].logprobs  # values: test_sglang_logprobs.py
        assert len(reported.token_logprobs) == 4 and all(-9999 < lp <= 0 for lp in reported.token_logprobs)
        for name, value in UNAPPLIED:
            with pytest.raises(urllib.error.HTTPError, match="400") as refused:
                generate(client, prompts[0], temperature=0.7, **{name: value})
            assert name in refused.value.read().decode()
        again = generate(client, prompts[0])["text"]
        adjusted = [out["output_ids"] for out in pool.map(lambda p: generate(client, p, **SGLANG_ADJUSTED),
                                                          prompts[:8])]
        plain = [out["output_ids"] for out in pool.map(lambda p: generate(client, p), prompts[:8])]
        held = [out["output_ids"] for out in pool.map(lambda ps: generate(
            client, ps[0], min_new_tokens=HELD, stop_token_ids=[ps[1]]),
            zip(prompts[:4], stop_tokens, strict=True))]
    # the penalties and bias applied
    ties.compare(adjusted, *adjusted_reference(model, spec, prompts[:8], SGLANG_REFERENCE_ADJUSTED))
    ties.compare(held, held_tokens, held_margins)  # min_new_tokens: a stop token held back
    assert all(len(tokens) >= HELD for tokens in held)
    assert adjusted != plain
    assert [(c.text, c.finish_reason) for c in stopped] == [(t[: t.index(s)], "stop") for t, s in zip(full, stops,
                                                                                                      strict=True)]
    assert streamed == full
    assert chatted == templated
    assert again == full[0]  # the refused requests left the server serving
