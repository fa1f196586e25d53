"""Huginn on SGLang (`decode_mode="huginn"` on a `RavenForCausalLM` checkpoint): every sampler SGLang serves gives
the `common.huginn` reference's tokens and logprobs, greedy and seeded, batched; under retraction the server keeps
serving and every request gets its tokens; a mode and a checkpoint that do not go together are refused before a
model loads.

Runs in the SGLang environment (see `tests/sglang/test_sglang_server.py`)."""

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sglang
import torch
from transformers import AutoTokenizer

from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.errors import ConfigError
from parallel_decoding.common.huginn.config import HuginnConfig
from parallel_decoding.common.huginn.reference import generate
from parallel_decoding.common.models.raven import RavenForCausalLM
from parallel_decoding.common.sampling import SamplingParams
from scripts.sglang_server import CPU_KWARGS, sglang_server
from tests.support import huginn_grammar
from tests.support.sglang_client import PRESSURE_ARGS, PRESSURE_ENV
from tests.support.sglang_client import generate as complete

MAX_TOKENS = 24
SEED = 11
TRAINED = Path(__file__).resolve().parents[2] / "scripts" / "trained" / "raven"
# What the requests that ask for no logprobs adjust: Huginn's samplers apply these to each position with the tokens
# before it as its history, by SGLang's definitions.
ADJUSTED = {"repetition_penalty": 2.0, "frequency_penalty": 0.5, "min_p": 0.1, "logit_bias": {7: -3.0}}


# Sampled, the trained Raven's wavefront hardly converges (thousands of steps a request): past
# `max_diffusion_steps` it freezes one position a step; greedy, it converges in under 30 steps. The wavefront, whose
# windows hold several positions, in CI; `ar` and `adaptive` (one position a step, through the same worker) as sweeps.
@pytest.mark.parametrize("settings", [pytest.param({"sampler": "ar"}, marks=pytest.mark.sweep),
                                      pytest.param({"sampler": "adaptive", "num_steps": 16}, marks=pytest.mark.sweep),
                                      {"sampler": "wavefront", "num_steps": 32, "inner_recurrence": 4,
                                       "max_diffusion_steps": 48}],
                         ids=["ar", "adaptive", "wavefront"])
def test_samplers_equal_the_reference(engine_dir, prompts, cpu_engine_env, settings):
    """Tokens, and for every other request the logprobs of the rows that chose them (the wavefront on the trained
    Raven, whose converged positions freeze several per step); the others with the penalties, a bias and min-p,
    which change their tokens."""
    model_dir = TRAINED if settings["sampler"] == "wavefront" else engine_dir["raven"]
    ids = [AutoTokenizer.from_pretrained(model_dir).encode(p)[:12] for p in prompts[:4]]
    model, config = RavenForCausalLM.from_pretrained(model_dir), HuginnConfig(**settings)
    requests = [(p, t, SEED + i) for t in (0.0, 1.0) for i, p in enumerate(ids)]
    asked = [i % 2 == 1 for i in range(len(requests))]  # the second prompt freezes two positions at once
    adjusting = [{} if asks else ADJUSTED for asks in asked]
    adjust = [{**a, "logit_bias": tuple(a["logit_bias"].items()), "rules": "sglang"} if a else {} for a in adjusting]
    want = [generate(model, p, config, SamplingParams(temperature=t, seed=s, **a), Limits(MAX_TOKENS))
            for (p, t, s), a in zip(requests, adjust, strict=True)]
    unadjusted = [generate(model, p, config, SamplingParams(temperature=t, seed=s), Limits(MAX_TOKENS))
                  for (p, t, s), asks in zip(requests, asked, strict=True) if not asks]
    assert [r.token_ids for r in unadjusted] != [r.token_ids for r, asks in zip(want, asked, strict=True) if not asks]
    engine = sglang.Engine(model_path=str(model_dir), decode_mode="huginn", decode_config=settings, **CPU_KWARGS)
    try:
        got = engine.generate(input_ids=[p for p, _, _ in requests], sampling_params=[
            {"temperature": t, "sampling_seed": s, "max_new_tokens": MAX_TOKENS, "ignore_eos": True,
             **{k: ({str(t): b for t, b in v.items()} if k == "logit_bias" else v) for k, v in a.items()}}
            for (_, t, s), a in zip(requests, adjusting, strict=True)], return_logprob=asked)
    finally:
        engine.shutdown()
    assert [out["output_ids"] for out in got] == [r.token_ids for r in want]
    for out, ref, asks in zip(got, want, asked, strict=True):  # temperature 0 or 1: SGLang's and the raw alike
        reported = out["meta_info"].get("output_token_logprobs")
        if not asks:
            assert not reported
            continue
        assert [token for _, token, _ in reported] == ref.token_ids
        torch.testing.assert_close(torch.tensor([value for value, _, _ in reported]), torch.tensor(ref.logprobs),
                                   atol=1e-4, rtol=0)


def test_retracted_requests_finish(engine_dir, prompts, tmp_path, monkeypatch):
    """A retracted request's KV is recomputed as `ar` computes it and its wavefront starts afresh, so its tokens
    may differ from an unretracted run's; it still gets all of them."""
    for name, value in PRESSURE_ENV.items():
        monkeypatch.setenv(name, value)
    log = tmp_path / "server.log"
    settings = {"sampler": "wavefront", "num_steps": 8, "inner_recurrence": 2}
    # Under this pool the requests run about one at a time, each retracted and re-admitted tens of times: eight
    # retract hundreds of times, and the last one's client no longer waits behind thirty others.
    prompts = prompts[:8]
    with (sglang_server(engine_dir["raven"], "huginn", json.dumps(settings), PRESSURE_ARGS, log) as client,
          ThreadPoolExecutor(len(prompts)) as pool):
        got = list(pool.map(lambda p: complete(client, p, temperature=0, max_new_tokens=MAX_TOKENS, ignore_eos=True)
                            ["output_ids"], prompts))
    text = log.read_text()
    retracted = sum(int(n) for n in re.findall(r"(?:Retract requests|Testing retraction)\. #retracted_reqs: (\d+)",
                                               text))
    assert retracted >= 4
    assert all(len(tokens) == MAX_TOKENS for tokens in got)


@pytest.mark.parametrize(("family", "mode", "config", "message"), [
    ("raven", "huginn", {"sampler": "speculative"}, "sampler must be one of"),
    ("raven", "huginn", {"cache_lookup_strategy": "full"}, "cache_lookup_strategy must be 'compress-s4'"),
    ("raven", "jacobi", {}, "served by decode mode huginn only"),
    ("qwen3", "huginn", {}, "decode mode huginn serves RavenForCausalLM"),
], ids=["speculative", "full-cache", "jacobi-on-raven", "huginn-on-qwen3"])
def test_mismatches_refused(engine_dir, cpu_engine_env, family, mode, config, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        sglang.Engine(model_path=str(engine_dir[family]), decode_mode=mode, decode_config=config, **CPU_KWARGS)


def test_published_config_instantiates(tmp_path):
    """Huginn-0125's `config.json` (remote-code `auto_map` and all) builds the SGLang model class: shapes only."""
    import torch
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    from parallel_decoding.common.checkpoint_configs import HuginnRavenConfig, register_configs
    from parallel_decoding.sglang_plugin.models.raven import RavenForCausalLM as SGLangRaven
    from tests.support.huginn_configs import HUGINN_0125

    register_configs()
    (tmp_path / "config.json").write_text(json.dumps(HUGINN_0125))
    runtime_context.publish(ServerArgs(model_path=str(tmp_path), device="cpu", skip_tokenizer_init=True), role="test")
    with torch.device("meta"):
        model = SGLangRaven(HuginnRavenConfig(**HUGINN_0125))
    assert 3.4e9 < sum(p.numel() for p in model.parameters()) < 3.7e9
    assert len(model.attn) == 8 and model.attn[0].head_dim == 96  # one KV slot per layer, the core's shared


@pytest.mark.parametrize("which", ["code", pytest.param("structured", marks=pytest.mark.sweep)])
def test_structured_output_equals_the_constrained_reference(cpu_engine_env, which):
    """On the trained Raven, the wavefront under regexes and JSON schemas (each decoder walking its own copy of
    SGLang's grammar object): the reference's tokens under the same constraints, every output valid. Four code
    requests in CI; the 40 requests of `scripts.structured_requests` as a sweep."""
    work = huginn_grammar.cases(which)
    want = huginn_grammar.reference(work)
    engine = sglang.Engine(model_path=str(TRAINED), decode_mode="huginn", decode_config=huginn_grammar.SETTINGS,
                           **CPU_KWARGS)
    try:
        got = engine.generate(input_ids=[p for p, _, _ in work], sampling_params=[
            {"temperature": 0, "max_new_tokens": n,
             **({"regex": c["regex"]} if "regex" in c else {"json_schema": json.dumps(c["json"])})}
            for _, c, n in work])
    finally:
        engine.shutdown()
    huginn_grammar.check(work, [out["output_ids"] for out in got], want)
