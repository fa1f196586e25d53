"""SGLang with `decode_mode="wedlm_spec"`: on the shipped trained WeDLM checkpoint greedy outputs are the `common/`
reference's (greedy AR's), batched, in the reference's verify steps, and under the penalties and `logit_bias` (SGLang's
definitions); under sampling it follows the model's distribution exactly.

Runs in the SGLang environment (see `tests/sglang/test_sglang_server.py`)."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import sglang

from parallel_decoding.common.checkpoint import load
from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.methods import make_decoder, parse_config
from parallel_decoding.common.runner import ReferenceRunner
from parallel_decoding.common.sampling import SamplingParams
from scripts import corpus
from scripts.sglang_server import CPU_ARGS, CPU_KWARGS, sglang_server
from scripts.trained_models import SHIPPED
from tests.support import ties
from tests.support.exact import P_VALUE_FLOOR, PARAMS, SAMPLES, SPEC_LENGTH, chi_square_p_value, exact_joint
from tests.support.reference_cli import SGLANG_ADJUSTED, SGLANG_REFERENCE_ADJUSTED
from tests.support.sglang_client import sample

MAX_TOKENS = 48
SETTINGS = {"window": 8, "adaptive": False}


def test_trained_wedlm_greedy_equals_reference(cpu_engine_env):
    """On the held-out prompts whose reference decoding takes no near-tied decision."""
    model_dir = SHIPPED / "wedlm"
    model, tokenizer = load(model_dir)
    config = parse_config("wedlm_spec", SETTINGS, mask_token_id=tokenizer.mask_token_id)
    ids, want, steps = [], [], 0
    for prompt in corpus.prompts(16):
        decoder = make_decoder("wedlm_spec", config, tokenizer.encode(prompt), SamplingParams(), Limits(MAX_TOKENS))
        result = ReferenceRunner(model).run(decoder)
        if ties.tie_position(result.margins) is None:
            ids.append(tokenizer.encode(prompt))
            want.append(result.token_ids)
            steps += result.forwards - 1  # the prefill gives the first token
    assert len(ids) >= 8
    adjusted = [ReferenceRunner(model).run(make_decoder("wedlm_spec", config, prompt, SGLANG_REFERENCE_ADJUSTED,
                                                        Limits(MAX_TOKENS))) for prompt in ids[:4]]
    engine = sglang.Engine(model_path=str(model_dir), decode_mode="wedlm_spec", decode_config=SETTINGS, **CPU_KWARGS)
    try:
        greedy = {"temperature": 0, "max_new_tokens": MAX_TOKENS, "ignore_eos": True}
        got = engine.generate(input_ids=ids, sampling_params=greedy)
        penalised = engine.generate(input_ids=ids[:4], sampling_params={**greedy, **SGLANG_ADJUSTED})
    finally:
        engine.shutdown()
    assert [out["output_ids"] for out in got] == want
    ties.compare([out["output_ids"] for out in penalised], [r.token_ids for r in adjusted],
                 [r.margins for r in adjusted])
    assert [r.token_ids for r in adjusted] != want[:4]
    assert sum(out["meta_info"]["spec_verify_ct"] for out in got) == steps < sum(map(len, want)) / 1.15


@pytest.mark.sweep  # three engines; CI runs the planner's test on diffusion_self (test_sglang_engine.py)
def test_the_width_planner_decides_what_is_forwarded(cpu_engine_env):
    """With rows dear (`step_cost`) every step is a plain AR step, one token each; with rows free every step
    forwards the whole window and takes the steps `adaptive: false` takes; AR's tokens either way."""
    model_dir = SHIPPED / "wedlm"
    model, tokenizer = load(model_dir)
    ids = [tokenizer.encode(prompt) for prompt in corpus.prompts(4)]
    want = [ReferenceRunner(model).run(make_decoder("ar", None, p, SamplingParams(), Limits(24))) for p in ids]
    steps = {}
    for label, extra in {"dear": {"step_cost": [0.01, 1.0, 1.0]}, "free": {"step_cost": [1.0, 0.0, 0.0]},
                         "fixed": {"adaptive": False}}.items():
        engine = sglang.Engine(model_path=str(model_dir), decode_mode="wedlm_spec",
                               decode_config={"window": 8, **extra}, **CPU_KWARGS)
        try:
            got = engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 24,
                                                                  "ignore_eos": True})
        finally:
            engine.shutdown()
        ties.compare([out["output_ids"] for out in got], [w.token_ids for w in want], [w.margins for w in want])
        steps[label] = sum(out["meta_info"]["spec_verify_ct"] for out in got)
    assert steps["dear"] == 23 * len(ids) and steps["free"] == steps["fixed"] < steps["dear"]


def test_distribution_matches_model(vocab8):
    path, model = vocab8
    params = PARAMS[0]
    with (sglang_server(path, "wedlm_spec", '{"window": 3}', extra_args=[*CPU_ARGS, "--skip-tokenizer-init"])
          as client, ThreadPoolExecutor(32) as pool):
        outputs = list(pool.map(lambda _: sample(client, params, SPEC_LENGTH), range(SAMPLES)))
    counts: dict[tuple[int, ...], int] = {}
    for key in outputs:
        counts[key] = counts.get(key, 0) + 1
    assert chi_square_p_value(counts, exact_joint(model, params, SPEC_LENGTH)) > P_VALUE_FLOOR
