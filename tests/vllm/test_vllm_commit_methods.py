"""vLLM with `wedlm` and `diffusion` returns exactly the tokens of `parallel-decoding generate` with the same
method, config and seed, under greedy decoding and under sampling, with EOS, stop tokens and max_tokens inside a
window, and reports WeDLM's p_cache and tokens per forward through its spec-decode counters."""

import itertools
import json

import pytest
import torch

from tests.support.vllm_engine import engine  # isort: split

from vllm import SamplingParams, TokensPrompt

from parallel_decoding.common.checkpoint import load
from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.methods import make_decoder, parse_config
from parallel_decoding.common.runner import ReferenceRunner
from parallel_decoding.common.sampling import SamplingParams as ReferenceSampling
from parallel_decoding.vllm_plugin.commit import CommitProposer
from parallel_decoding.vllm_plugin.metrics import acceptance
from tests.support import ties
from tests.support.reference_cli import HELD, MAX_TOKENS, SEED, held_reference, reference, settings
from tests.support.vllm_cases import STOP_AT

SPECS = [
    {"method": "wedlm", "window": 4, "entropy_threshold": 0.4, "distance_penalty": 0.02},
    {"method": "wedlm", "window": 8, "entropy_threshold": 5.0, "distance_penalty": 0.02},
    {"method": "diffusion", "block_size": 4, "confidence_threshold": 0.5},
    {"method": "diffusion", "block_size": 8, "confidence_threshold": 0.1},
]
WIDTH = 8  # the widest window or block above


# CI: `wedlm` greedy and `diffusion` sampled (the decoders pick both ways through the same path); the rest as sweeps.
CLI_CASES = [pytest.param(spec, temperature, id=f"{'-'.join(f'{v}' for v in spec.values())}-{label}",
                          marks=[] if (i, label) in ((0, "greedy"), (2, "sampled")) else [pytest.mark.sweep])
             for i, spec in enumerate(SPECS) for temperature, label in ((0.0, "greedy"), (1.0, "sampled"))]


@pytest.mark.parametrize(("spec", "temperature"), CLI_CASES)
def test_equals_reference_cli(engine_dir, prompts, tmp_path, spec, temperature):
    """Also: the output for max_tokens = n is a prefix of the output for n + 2W (the window keeps its width to
    the end), in the same batch."""
    expected, margins = reference(engine_dir["qwen3"], spec, prompts, tmp_path, temperature)
    longer, long_margins = reference(engine_dir["qwen3"], spec, prompts, tmp_path, temperature, MAX_TOKENS + 2 * WIDTH)
    params = SamplingParams(temperature=temperature, seed=SEED, max_tokens=MAX_TOKENS)
    long_params = SamplingParams(temperature=temperature, seed=SEED, max_tokens=MAX_TOKENS + 2 * WIDTH)
    with engine(engine_dir["qwen3"], spec) as llm:
        outputs = llm.generate(prompts + prompts, [params] * len(prompts) + [long_params] * len(prompts))
    got = [list(o.outputs[0].token_ids) for o in outputs]
    ties.compare(got, expected + longer, margins + long_margins)
    assert [tokens[:MAX_TOKENS] for tokens in longer] == expected


@pytest.mark.parametrize("spec", [SPECS[1], SPECS[3]], ids=["wedlm", "diffusion"])
def test_stops_inside_a_window(engine_dir, prompts, spec):
    """EOS (a stop token from inside the output) and a small max_tokens end the request mid-window, as the
    reference decoder does; the usage counts are the tokens returned."""
    model, tokenizer = load(engine_dir["qwen3"])
    config = parse_config(spec["method"], json.loads(settings(spec)), mask_token_id=model.config.mask_token_id)
    runner = ReferenceRunner(model)
    cases, params = [], []
    for prompt in prompts[:16]:
        ids = tokenizer.encode(prompt)
        full = runner.run(make_decoder(spec["method"], config, ids, ReferenceSampling(), Limits(MAX_TOKENS)))
        eos = full.token_ids[STOP_AT]
        stopped = runner.run(make_decoder(spec["method"], config, ids, ReferenceSampling(), Limits(MAX_TOKENS, (eos,))))
        short = runner.run(make_decoder(spec["method"], config, ids, ReferenceSampling(), Limits(7)))
        cases += [(prompt, stopped), (prompt, short)]
        params += [SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop_token_ids=[eos]),
                   SamplingParams(temperature=0, max_tokens=7)]
    with engine(engine_dir["qwen3"], spec) as llm:
        outputs = llm.generate([prompt for prompt, _ in cases], params)
    ties.compare([list(out.outputs[0].token_ids) for out in outputs], [r.token_ids for _, r in cases],
                 [r.margins for _, r in cases])
    assert all(out.outputs[0].finish_reason in ("stop", "length") for out in outputs)
    assert any(len(r.token_ids) < MAX_TOKENS and len(r.token_ids) != 7 for _, r in cases)


def test_wedlm_p_cache_and_tokens_per_forward_in_metrics(engine_dir, prompts):
    """vLLM's counters carry WeDLM's p_cache (accepted / draft tokens) and tokens per decode forward."""
    spec = SPECS[1]
    model, tokenizer = load(engine_dir["qwen3"])
    config = parse_config("wedlm", json.loads(settings(spec)), mask_token_id=model.config.mask_token_id)
    committed = rows = decode_forwards = 0
    for prompt in prompts:
        decoder = make_decoder("wedlm", config, tokenizer.encode(prompt), ReferenceSampling(), Limits(MAX_TOKENS))
        ReferenceRunner(model).run(decoder)
        committed += len(decoder.output) - decoder.prefill_tokens
        rows += decoder.decode_rows
        decode_forwards += decoder.forwards - 1
    with engine(engine_dir["qwen3"], spec) as llm:
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))
        stats = acceptance(llm)
    assert (stats.num_accepted_tokens, stats.num_draft_tokens, stats.num_drafts) == (committed, rows, decode_forwards)
    assert stats.num_accepted_tokens / stats.num_draft_tokens == pytest.approx(committed / rows)


@pytest.mark.parametrize("spec", [SPECS[1], SPECS[3]], ids=["wedlm", "diffusion"])
def test_committed_kv_equals_fresh_prefill(engine_dir, prompts, monkeypatch, spec):
    """The KV a method committed, reused through vLLM's prefix cache, gives the logits of a fresh prefill."""
    prefill_logits: dict[tuple[int, ...], torch.Tensor] = {}
    started: list[str] = []
    start, before_sample = CommitProposer.start, CommitProposer.before_sample

    def spy_start(self, runner, req_id):
        started.append(req_id)
        return start(self, runner, req_id)

    def spy(self, runner, logits, metadata):
        """The last logit row of each request whose prompt this step completed."""
        started.clear()
        output = before_sample(self, runner, logits, metadata)
        batch = runner.input_batch
        ends = metadata.cu_num_sampled_tokens.tolist() if metadata is not None else range(1, batch.num_reqs + 1)
        for req_id, end in zip(batch.req_ids, ends, strict=True):
            if req_id in started:
                prefill_logits[tuple(self.requests[req_id].decoder.prompt)] = logits[end - 1].float().cpu().clone()
        return output

    monkeypatch.setattr(CommitProposer, "start", spy_start)
    monkeypatch.setattr(CommitProposer, "before_sample", spy)
    with engine(engine_dir["qwen3"], spec) as llm:
        outputs = llm.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=80, ignore_eos=True))
        sequences = [list(o.prompt_token_ids) + list(o.outputs[0].token_ids) for o in outputs]
        llm.generate([TokensPrompt(prompt_token_ids=s) for s in sequences], SamplingParams(max_tokens=1))
        hits = sum(m.value for m in llm.get_metrics() if m.name == "vllm:prefix_cache_hits")
    assert hits >= 4 * 64
    model, _ = load(engine_dir["qwen3"])
    for sequence in sequences:
        with torch.inference_mode():
            fresh = model(input_ids=torch.tensor([sequence])).logits[0, -1]
        torch.testing.assert_close(prefill_logits[tuple(sequence)], fresh, atol=2e-3, rtol=2e-3)


# Penalties and an allowed-token list, as vLLM takes them and as `common/` does (`common.penalties`).
ADJUSTED = {"presence_penalty": 0.5, "frequency_penalty": 0.4, "repetition_penalty": 1.5}


def adjusted_reference(model_dir, method: str, spec: dict, prompts: list[str], allowed: list[int]):
    """The reference runner's greedy outputs and margins under `ADJUSTED` and `allowed`."""
    model, tokenizer = load(model_dir)
    config = parse_config(method, json.loads(settings(spec)) if method != "ar" else {},
                          mask_token_id=model.config.mask_token_id)
    sampling = ReferenceSampling(**ADJUSTED, allowed_token_ids=tuple(allowed))
    runs = [ReferenceRunner(model).run(make_decoder(method, config, tokenizer.encode(p), sampling, Limits(MAX_TOKENS)))
            for p in prompts]
    return [r.token_ids for r in runs], [r.margins for r in runs]


def generated(model_dir, speculative: dict | None, prompts: list[str], params: list) -> list[list[int]]:
    """Token ids from an engine that is gone when this returns (the next one needs its process groups)."""
    with engine(model_dir, speculative) as llm:
        return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]


def test_penalties_equal_the_reference(engine_dir, prompts):
    """`wedlm` applies the penalties and allowed tokens in its decoder, each slot with the tokens before it as its
    history, and `min_tokens` by each slot's position: vLLM's output equals the reference runner's under the same
    settings, in a batch with plain requests, and differs from the plain output (under `min_tokens`, a stop token the
    plain output reaches third is held back); plain AR in vLLM under them equals the reference's AR (the same
    formulas as vLLM's sampler)."""
    spec = SPECS[0]
    allowed = list(range(3, 400))
    batch = prompts[:8]
    adjusted = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, allowed_token_ids=allowed, **ADJUSTED)
    plain = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    for method, speculative in (("wedlm", spec), ("ar", None)):
        want, margins = adjusted_reference(engine_dir["qwen3"], method, spec, batch, allowed)
        stops, held, held_margins = held_reference(engine_dir["qwen3"], speculative, batch[:4])
        held_params = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS, min_tokens=HELD, stop_token_ids=[stop])
                       for stop in stops]
        got = generated(engine_dir["qwen3"], speculative, batch + batch + batch[:4],
                        [adjusted] * len(batch) + [plain] * len(batch) + held_params)
        ties.compare(got[: len(batch)], want, margins)
        assert got[: len(batch)] != got[len(batch) : 2 * len(batch)]
        ties.compare(got[2 * len(batch) :], held, held_margins)  # min_tokens: stop tokens held back
        assert all(len(tokens) >= HELD for tokens in got[2 * len(batch) :])


def test_bias_and_min_p_equal_the_reference(engine_dir, prompts):
    """`logit_bias` and `min_p`, which vLLM refuses with any speculative method, `wedlm`'s decoder applies (carried
    past vLLM's check, `vllm_plugin.requests.carry_adjustments`): greedy under a bias, and seeded sampling under
    min-p, give the reference runner's tokens under the same settings, which differ from those without them."""
    spec, batch = SPECS[0], prompts[:4]
    model, tokenizer = load(engine_dir["qwen3"])
    config = parse_config("wedlm", json.loads(settings(spec)), mask_token_id=model.config.mask_token_id)
    bias, min_p = {7: 4.0, 11: 3.0}, 0.25
    cases = [(SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logit_bias=bias),
              ReferenceSampling(logit_bias=tuple(bias.items())), ReferenceSampling()),
             (SamplingParams(temperature=1.0, seed=SEED, max_tokens=MAX_TOKENS, min_p=min_p),
              ReferenceSampling(temperature=1.0, seed=SEED, min_p=min_p),
              ReferenceSampling(temperature=1.0, seed=SEED))]

    def run(sampling: ReferenceSampling) -> list:
        return [ReferenceRunner(model).run(make_decoder("wedlm", config, tokenizer.encode(p), sampling,
                                                        Limits(MAX_TOKENS))) for p in batch]

    got = generated(engine_dir["qwen3"], spec, batch * len(cases), [p for p, _, _ in cases for _ in batch])
    for i, (_, with_option, without) in enumerate(cases):
        want = run(with_option)
        ties.compare(got[i * len(batch) : (i + 1) * len(batch)], [r.token_ids for r in want], [r.margins for r in want])
        assert [r.token_ids for r in want] != [r.token_ids for r in run(without)]


def vllm_bad_words(tokenizer, words: list[str]) -> list[list[int]]:
    """The token ids vLLM bans for `words` (`SamplingParams.update_from_tokenizer`: each word with and without a
    leading space)."""
    from types import SimpleNamespace

    params = SamplingParams(bad_words=words)
    params.update_from_tokenizer(SimpleNamespace(encode=tokenizer.encode, max_token_id=len(tokenizer) - 1))
    return params.bad_words_token_ids


def two_token_word(tokenizer, tokens: list[int]) -> str | None:
    """A word made of two of `tokens` in a row that vLLM tokenizes back to those two."""
    for pair in itertools.pairwise(tokens):
        text = tokenizer.decode(list(pair)).strip()
        if text and list(pair) in vllm_bad_words(tokenizer, [text]):
            return text
    return None


@pytest.mark.parametrize("spec", [SPECS[0], pytest.param(
    {"method": "diffusion_self", "mode": "quadratic", "num_speculative_tokens": 3}, marks=pytest.mark.sweep)],
    ids=["wedlm", "quadratic"])
def test_bad_words_equal_the_reference(engine_dir, prompts, spec):
    """`bad_words`, by vLLM's rule (a word's last token banned after its other tokens, over the output), the
    committing decoders apply as a grammar over what they commit (`common.bad_words`): greedy vLLM equals the
    reference runner given the words vLLM tokenized, in a batch with plain requests; two-token words the plain
    output holds never occur under them."""
    from parallel_decoding.common.bad_words import BadWords

    batch = prompts[:6]
    model, tokenizer = load(engine_dir["qwen3"])
    config = parse_config(spec["method"], json.loads(settings(spec)), mask_token_id=model.config.mask_token_id)

    def run(words: list[list[int]]) -> list:
        results = []
        for prompt in batch:
            decoder = make_decoder(spec["method"], config, tokenizer.encode(prompt), ReferenceSampling(),
                                   Limits(MAX_TOKENS))
            decoder.grammar = BadWords(words) if words else None
            results.append(ReferenceRunner(model).run(decoder))
        return results

    plain = run([])
    words = list(dict.fromkeys(w for r in plain if (w := two_token_word(tokenizer, r.token_ids)) is not None))[:2]
    assert len(words) == 2, words
    banned = vllm_bad_words(tokenizer, words)
    want = run(banned)
    params = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS, bad_words=words),
              SamplingParams(temperature=0, max_tokens=MAX_TOKENS)]
    got = generated(engine_dir["qwen3"], spec, batch * 2, [params[0]] * len(batch) + [params[1]] * len(batch))
    ties.compare(got, [r.token_ids for r in want + plain], [r.margins for r in want + plain])

    def holds(tokens: list[int], word: list[int]) -> bool:
        return any(tokens[i : i + len(word)] == word for i in range(len(tokens)))

    assert any(holds(r.token_ids, word) for r in plain for word in banned if len(word) == 2)
    assert not any(holds(r.token_ids, word) for r in want for word in banned)
