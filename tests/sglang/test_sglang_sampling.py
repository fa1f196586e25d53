"""Under sampling, SGLang with `--decode-mode jacobi` (with and without rejection recycling) and `diffusion_self`
follows the model's distribution exactly, as SGLang's own sampler cuts it (top-k, top-p and min-p together; checked
on SGLang's AR too) (3000 unseeded requests on a vocabulary-8 model, chi-square against the
exact joint from `tests/common/test_sampling_exact.py`).

Runs in the SGLang environment; skipped where SGLang is not installed unless `PD_REQUIRE_SGLANG=1`."""

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from parallel_decoding.common.sampling import SamplingParams
from scripts.sglang_server import CPU_ARGS, sglang_server
from tests.support.exact import P_VALUE_FLOOR, PARAMS, SAMPLES, chi_square_p_value, exact_joint
from tests.support.sglang_client import sample

# Recycling Jacobi as a sweep: its decoder commits, and its seeded tokens equal the reference decoder's
# (`test_sglang_recycling.py`), whose samples follow the model's distribution (`tests/common/test_sampling_exact.py`).
# diffusion_self as a sweep: it samples through the verify worker and rejection rule Jacobi's run tests in CI.
MODES = [("jacobi", '{"block_size": 3}'),
         pytest.param("diffusion_self", '{"num_speculative_tokens": 2}', marks=pytest.mark.sweep),
         pytest.param("jacobi", '{"block_size": 2, "pool_size": 4, "verification_size": 2}', marks=pytest.mark.sweep)]


# SGLang's own cuts together (`common.sampling`, SGLang's definitions): top-k, top-p over the whole distribution, min-p;
# chosen so that on this model the joint is far from vLLM's definitions' and from the same cuts without min-p.
CUTS = SamplingParams(temperature=2.0, top_k=4, top_p=0.8, min_p=0.2, rules="sglang")


def follows(client, model, params: SamplingParams) -> float:
    """The chi-square p-value of `SAMPLES` unseeded continuations against the exact joint under `params`."""
    with ThreadPoolExecutor(32) as pool:
        outputs = list(pool.map(sample, [client] * SAMPLES, [params] * SAMPLES))
    counts: dict[tuple[int, ...], int] = {}
    for key in outputs:
        counts[key] = counts.get(key, 0) + 1
    return chi_square_p_value(counts, exact_joint(model, params))


@pytest.mark.parametrize(("mode", "config"), MODES,
                         ids=["jacobi", "diffusion_self", "jacobi-recycling"])
def test_distribution_matches_model(vocab8, mode, config):
    path, model = vocab8
    with sglang_server(path, mode, config, extra_args=[*CPU_ARGS, "--skip-tokenizer-init"]) as client:
        for params in [*PARAMS, CUTS] if mode == "jacobi" and "pool" not in config else PARAMS:
            assert follows(client, model, params) > P_VALUE_FLOOR, (mode, params)


def test_sglangs_own_sampler_cuts_as_common_does(vocab8):
    """SGLang's AR under top-k, top-p and min-p together samples the joint `common.sampling` gives by SGLang's
    definitions (and not by vLLM's, whose top-p after top-k keeps less), so the modes above follow SGLang's AR."""
    path, model = vocab8
    joint = exact_joint(model, CUTS)
    for other in (replace(CUTS, rules="vllm"), replace(CUTS, min_p=0.0)):  # what a wrong definition would sample
        distance = sum(abs(p - q) for p, q in zip(joint.values(), exact_joint(model, other).values(), strict=True))
        assert distance / 2 > 0.1, other
    with sglang_server(path, extra_args=[*CPU_ARGS, "--skip-tokenizer-init"]) as client:
        assert follows(client, model, CUTS) > P_VALUE_FLOOR
