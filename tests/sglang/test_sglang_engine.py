"""SGLang's offline `sglang.Engine` takes `decode_mode` and `decode_config` keyword arguments: a batch decoded
with WeDLM equals `common/`'s reference decoder token for token; bad settings raise before any model loads.

Runs in the SGLang environment (see `tests/sglang/test_sglang_server.py`)."""

import re

import pytest
import sglang

from parallel_decoding.common.checkpoint import load
from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.errors import ConfigError
from parallel_decoding.common.methods import make_decoder, parse_config
from parallel_decoding.common.runner import ReferenceRunner
from parallel_decoding.common.sampling import SamplingParams
from scripts.sglang_server import CPU_KWARGS
from tests.support import ties

CONFIG = {"window": 4, "entropy_threshold": 0.4}




def generate(model_dir, mode: str, config: dict, ids: list[list[int]]) -> tuple[list[dict], dict]:
    """20 greedy tokens per prompt from an offline engine selecting `mode` by keywords, shut down after; with the
    width planner's record (empty where the mode has none)."""
    engine = sglang.Engine(model_path=str(model_dir), decode_mode=mode, decode_config=config, **CPU_KWARGS)
    try:
        outputs = engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 20,
                                                                  "ignore_eos": True})
        return outputs, engine.get_server_info()["internal_states"][0].get("parallel_decoding_width_planner", {})
    finally:
        engine.shutdown()


def test_engine_keywords_equal_reference(engine_dir, prompts, cpu_engine_env):
    model, tokenizer = load(engine_dir["qwen3"])
    config = parse_config("wedlm", CONFIG, mask_token_id=model.config.mask_token_id)
    ids = [tokenizer.encode(prompt) for prompt in prompts[:8]]
    expected = [ReferenceRunner(model).run(make_decoder("wedlm", config, p, SamplingParams(), Limits(20)))
                for p in ids]
    outputs, _ = generate(engine_dir["qwen3"], "wedlm", CONFIG, ids)
    ties.compare([out["output_ids"] for out in outputs], [e.token_ids for e in expected],
                 [e.margins for e in expected])


@pytest.mark.parametrize("config", [{"num_speculative_tokens": 4}, pytest.param(
    {"mode": "quadratic", "num_speculative_tokens": 3}, marks=pytest.mark.sweep)], ids=["linear", "quadratic"])
def test_the_width_planner_decides_what_is_forwarded(engine_dir, prompts, cpu_engine_env, config):
    """`diffusion_self`, both modes: with rows dear (`step_cost`) every step is a plain AR step, one token each;
    with rows free every step drafts the full width and accepts what `adaptive: false` does; the reference's AR
    tokens either way."""
    model, tokenizer = load(engine_dir["qwen3"])
    ids = [tokenizer.encode(prompt) for prompt in prompts[:6]]
    expected = [ReferenceRunner(model).run(make_decoder("ar", parse_config("ar"), p, SamplingParams(), Limits(20)))
                for p in ids]
    steps, steady, own, runs = {}, {}, {}, {}
    for label, extra in {"dear": {"step_cost": [0.01, 1.0, 1.0]}, "free": {"step_cost": [1.0, 0.0, 0.0]},
                         "fixed": {"adaptive": False}}.items():
        outputs, planner = generate(engine_dir["qwen3"], "diffusion_self", {**config, **extra}, ids)
        ties.compare([out["output_ids"] for out in outputs], [e.token_ids for e in expected],
                     [e.margins for e in expected])
        steps[label] = sum(out["meta_info"]["spec_verify_ct"] for out in outputs)
        steady[label] = planner.get("steady_steps", 0)
        own[label] = planner.get("own_decode_steps", 0)
        runs[label] = planner.get("plain_runs", 0)
    assert steps["dear"] == 19 * len(ids) and steps["free"] == steps["fixed"] < steps["dear"]
    # Rows dear, every step after the batch's first plain one repeats it with no per-request work, also the last ones,
    # whose limits shrink as the requests near their most tokens (`WidthPlanner.plain_again`), each run as SGLang's
    # own decode step (`sglang_plugin.steady_decode`; no CUDA graphs here).
    assert steady["dear"] >= 18 and steady["free"] == steady["fixed"] == 0, steady
    assert own == steady, own
    # The batch stays switched to SGLang's plain decode from its first steady step to its last: one run.
    assert runs == {"dear": 1, "free": 0, "fixed": 0}, runs


@pytest.mark.parametrize("spec", [
    {"method": "jacobi", "block_size": 4, "step_cost": [1.0, 0.5, 0.0]},
    {"method": "jacobi", "block_size": 3, "pool_size": 16, "verification_size": 2, "step_cost": [1.0, 0.1, 0.0]},
    # Rows priced lower: its plans count the steps that lay mask slots afresh after a rejection (verifying none).
    {"method": "wedlm_spec", "window": 4, "step_cost": [1.0, 0.06, 0.0]},
], ids=["jacobi", "jacobi-recycling", "wedlm_spec"])
def test_paused_decoders_catch_up_when_the_batch_shrinks(engine_dir, prompts, cpu_engine_env, spec):
    """Rows priced so that a batch of four or more takes plain AR steps and one of two drafts (`step_cost`): requests
    of three lengths pause their decoders while the batch is full, then catch up and draft once the short ones have
    finished; AR's tokens throughout."""
    model, tokenizer = load(engine_dir["qwen3"])
    ids = [tokenizer.encode(prompt) for prompt in prompts[:6]]
    lengths = [6, 6, 12, 12, 24, 24]
    expected = [ReferenceRunner(model).run(make_decoder("ar", parse_config("ar"), p, SamplingParams(), Limits(n)))
                for p, n in zip(ids, lengths, strict=True)]
    config = {k: v for k, v in spec.items() if k != "method"}
    engine = sglang.Engine(model_path=str(engine_dir["qwen3"]), decode_mode=spec["method"], decode_config=config,
                           **CPU_KWARGS)
    try:
        outputs = engine.generate(input_ids=ids, sampling_params=[
            {"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for n in lengths])
        planner = engine.get_server_info()["internal_states"][0]["parallel_decoding_width_planner"]
    finally:
        engine.shutdown()
    ties.compare([out["output_ids"] for out in outputs], [e.token_ids for e in expected], [e.margins for e in expected])
    paused = planner.get("paused_steps", planner.get("paused_request_steps"))
    assert paused >= 5 and planner["drafts_per_step"] > 0, planner
    assert planner["steady_steps"] >= 3, planner  # the full batch's plain steps after its first: no per-request work
    assert planner["others_wait"] == 0, planner  # told after each batch (`sglang_plugin.waiting`): none wait now


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"decode_mode": "assd"}, "decode_mode must be one of"),
    ({"decode_config": {"window": 4}}, "decode_config needs decode_mode"),
    ({"decode_mode": "wedlm", "decode_config": {"window": 0}}, "window must be a positive integer"),
    ({"decode_mode": "wedlm", "decode_config": {"block_size": 4}}, "unknown field(s) ['block_size']"),
], ids=["unknown-mode", "config-without-mode", "bad-value", "unknown-field"])
def test_engine_bad_keywords_raise(engine_dir, cpu_engine_env, kwargs, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        sglang.Engine(model_path=str(engine_dir["qwen3"]), **kwargs, **CPU_KWARGS)


@pytest.mark.sweep  # a profiling run of two engines (`scripts.profile_step`), not in CI's budget
def test_profile_step_times_sglang_steps(tmp_path):
    """`scripts.profile_step --engine sglang` times jacobi's and SGLang's plain decode steps inside the scheduler
    process, prefill left out: the parts add up to the step, and jacobi's step is set beside AR's."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-m", "scripts.profile_step", "--engine", "sglang", "--models",
                          str(tmp_path / "m"), "--json", str(tmp_path / "p.json"), "--methods", "jacobi",
                          "--batch-sizes", "2", "--max-tokens", "12"], cwd=root, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    records = {r["method"]: r for r in json.loads((tmp_path / "p.json").read_text())}
    assert set(records) == {"ar", "jacobi"}
    for record in records.values():
        parts = sum(record[f"{part}_ms"] for part in ("forward", "extra_forward", "hooks", "engine"))
        assert abs(parts - record["step_ms"]) < 1e-6 and record["forward_ms"] > 0 and record["steps"] > 0
    jacobi, ar = records["jacobi"], records["ar"]
    assert jacobi["per_step_vs_ar"] == jacobi["step_ms"] / ar["step_ms"]
    assert jacobi["rows_per_step"] > ar["rows_per_step"] and jacobi["tokens_per_step"] > 1
    assert ar["steps"] == 11 and ar["rows_per_step"] == 2 and ar["tokens_per_step"] == 2  # 12 tokens less prefill's
    assert jacobi["forwards_per_step"] == ar["forwards_per_step"] == 1  # one window per step


def test_window_mask_equals_per_request_blocks():
    """The workers' flat custom mask, built in one scatter, is each request's [cached prefix, window] rows in turn."""
    import torch

    from parallel_decoding.sglang_plugin.worker import window_mask

    generator = torch.Generator().manual_seed(1)
    for _ in range(100):
        bs, width = (int(torch.randint(1, high, (1,), generator=generator)) for high in (6, 9))
        starts = torch.randint(0, 30, (bs,), generator=generator)
        visible = torch.rand(bs, width, width, generator=generator) < 0.5
        blocks = [torch.cat([torch.ones(width, int(prefix), dtype=torch.bool), rows], 1).flatten()
                  for prefix, rows in zip(starts.tolist(), visible, strict=True)]
        assert torch.equal(window_mask(starts, visible, int(starts.sum())), torch.cat(blocks))


def test_every_method_common_serves_on_sglang_is_a_decode_mode():
    """The adapter's glue covers exactly the methods `common.methods` says SGLang serves."""
    from parallel_decoding.common.methods import served_by
    from parallel_decoding.sglang_plugin.cli import ALGORITHMS

    assert set(ALGORITHMS) == set(served_by("sglang"))
