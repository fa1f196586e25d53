"""Under sampling, SGLang with `--decode-mode jacobi` (with and without rejection recycling) and `diffusion_self`
follows the model's distribution exactly (3000 unseeded requests on a vocabulary-8 model, chi-square against the
exact joint from `tests/common/test_sampling_exact.py`).

Runs in the SGLang environment; skipped where SGLang is not installed unless `PD_REQUIRE_SGLANG=1`."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from scripts.sglang_server import CPU_ARGS, sglang_server
from tests.support.exact import P_VALUE_FLOOR, PARAMS, SAMPLES, chi_square_p_value, exact_joint
from tests.support.sglang_client import sample

MODES = [("jacobi", '{"block_size": 3}'), ("diffusion_self", '{"num_speculative_tokens": 2}'),
         ("jacobi", '{"block_size": 2, "pool_size": 4, "verification_size": 2}')]




@pytest.mark.parametrize(("mode", "config"), MODES,
                         ids=["jacobi", "diffusion_self", "jacobi-recycling"])
def test_distribution_matches_model(vocab8, mode, config):
    path, model = vocab8
    with sglang_server(path, mode, config, extra_args=[*CPU_ARGS, "--skip-tokenizer-init"]) as client:
        for params in PARAMS:
            with ThreadPoolExecutor(32) as pool:
                outputs = list(pool.map(sample, [client] * SAMPLES, [params] * SAMPLES))
            counts: dict[tuple[int, ...], int] = {}
            for key in outputs:
                counts[key] = counts.get(key, 0) + 1
            assert chi_square_p_value(counts, exact_joint(model, params)) > P_VALUE_FLOOR, (mode, params)
