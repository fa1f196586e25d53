"""WeDLM and Nemotron-Labs-Diffusion checkpoints as shipped (their architecture names, model types, `auto_map`, NLD's
weight names and llama-4 query scaling) served by SGLang without remote code: each mode returns the tokens of
`parallel-decoding generate` on the same checkpoint (greedy AR for the lossless `diffusion_self`).

Runs in the SGLang environment (see `tests/sglang/test_sglang_server.py`)."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from scripts.sglang_server import sglang_server
from tests.support import ties
from tests.support.reference_cli import reference, settings
from tests.support.sglang_client import generate

CASES = [
    ("wedlm", {"method": "wedlm", "window": 4}, {"method": "wedlm", "window": 4}),
    ("nld", {"method": "diffusion_self", "num_speculative_tokens": 4}, {"method": "ar"}),
    # a sweep: block diffusion equals the reference in CI on the tiny checkpoint (`test_sglang_commit_modes.py`)
    pytest.param("nld", {"method": "diffusion", "block_size": 8, "confidence_threshold": 0.3},
                 {"method": "diffusion", "block_size": 8, "confidence_threshold": 0.3}, marks=pytest.mark.sweep),
]


@pytest.mark.parametrize(("family", "spec", "expected_spec"), CASES,
                         ids=["wedlm", "nld-diffusion_self", "nld-diffusion"])
def test_shipped_checkpoint_equals_reference(engine_dir, prompts, tmp_path, family, spec, expected_spec):
    model = engine_dir[family]
    expected, margins = reference(model, expected_spec, prompts[:16], tmp_path, 0.0)
    with sglang_server(model, spec["method"], settings(spec)) as client, ThreadPoolExecutor(16) as pool:
        got = [out["output_ids"] for out in pool.map(lambda p: generate(client, p), prompts[:16])]
    ties.compare(got, expected, margins)
