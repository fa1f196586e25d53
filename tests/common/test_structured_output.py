"""Structured output in `common/`'s decoders, the reference the engines are held to: with a request's grammar
(xgrammar's matcher, `common.grammar`), the lossless methods equal constrained AR token for token (tie-aware) on
the real model, and the committing methods' outputs on the trained tiny checkpoints are valid and equal a
from-scratch recompute (no KV cache) under the same grammar; without the grammar the outputs break it."""

import pytest

from parallel_decoding.common.checkpoint import eos_token_ids, load
from parallel_decoding.common.diffusion_self import DRAFT_ADAPTER
from parallel_decoding.common.lora import LoRA
from parallel_decoding.common.methods import parse_config
from parallel_decoding.common.runner import ReferenceRunner
from scripts import smollm2
from scripts.trained_models import SHIPPED
from tests.support import structured, ties

LOSSLESS = {
    "jacobi": ("jacobi", {"block_size": 8, "pool_size": 4}),  # rejection recycling: its decoder commits
    "quadratic": ("diffusion_self", {"mode": "quadratic", "num_speculative_tokens": 3,
                                     "draft_adapter": smollm2.ADAPTER_DIR}),
    "linear": ("diffusion_self", {"num_speculative_tokens": 8, "draft_adapter": smollm2.ADAPTER_DIR}),
    "wedlm_spec": ("wedlm_spec", {"window": 4}),
}
COMMITTING = {"wedlm": ("wedlm", {"window": 8}), "diffusion": ("nld", {"block_size": 8})}  # checkpoint, settings
CI_REQUESTS = [0, 20]  # a JSON schema and a regex of `scripts.structured_requests`
AR: dict = {}  # (prompt, constraint) -> constrained and free AR results on the real model


def decode(runner, grammars, method, settings, prompt, constraint, max_tokens, eos, mask=None, dlm_type=None):
    config = parse_config(method, settings, mask_token_id=mask, **({"dlm_type": dlm_type} if dlm_type else {}))
    return structured.decode(runner, grammars, method, config, prompt, constraint, max_tokens, eos)


@pytest.fixture(scope="module")
def smollm2_f32(real_model):
    model, tokenizer = load(real_model)
    adapters = {DRAFT_ADAPTER: LoRA(model, real_model / smollm2.ADAPTER_DIR).enabled}
    return model, tokenizer, ReferenceRunner(model, adapters=adapters), structured.Grammars(
        real_model, model.config.vocab_size)


@pytest.mark.parametrize("name", [*["jacobi", "quadratic"], *(pytest.param(n, marks=pytest.mark.sweep)
                                                              for n in ("linear", "wedlm_spec"))])
def test_lossless_methods_equal_constrained_ar(real_model, smollm2_f32, name, request):
    """Float32 SmolLM2: every output valid under its constraint and equal to constrained AR's (tie-aware on its
    masked margins); CI runs 2 of the 40 requests, the sweep all."""
    model, tokenizer, runner, grammars = smollm2_f32
    sweep = request.node.get_closest_marker("sweep") is not None
    requests = structured.requests(real_model)
    requests = requests if sweep else [requests[i] for i in CI_REQUESTS]
    eos = eos_token_ids(model, tokenizer)
    method, settings = LOSSLESS[name]
    got, want, margins, unconstrained_valid = [], [], [], 0
    for prompt, constraint, max_tokens in requests:
        key = (tuple(prompt), str(constraint))
        if key not in AR:  # constrained and free AR, shared by the methods
            AR[key] = [decode(runner, grammars, "ar", {}, prompt, c, max_tokens, eos) for c in (constraint, None)]
        (ar, free) = AR[key]
        out = decode(runner, grammars, method, settings, prompt, constraint, max_tokens, eos, 16, "dream")
        accepted, ended, _ = grammars.walk(constraint, out.token_ids)
        assert accepted and (ended or len(out.token_ids) == max_tokens), (name, constraint, out.token_ids)
        got.append(out.token_ids)
        want.append(ar.token_ids)
        margins.append(ar.margins)
        unconstrained_valid += all(grammars.walk(constraint, free.token_ids)[:2])
    ties.compare(got, want, margins)
    assert unconstrained_valid < len(requests), "the constraint never bit: the test would pass without it"


@pytest.mark.parametrize("name", list(COMMITTING))
def test_committing_methods_valid_and_equal_to_recompute(name):
    """The trained tiny checkpoints: every output valid under its constraint, the KV-cached path equal to the
    recompute (tie-aware), and some output different from the unconstrained one."""
    checkpoint, settings = COMMITTING[name]
    path = SHIPPED / checkpoint
    model, tokenizer = load(path)
    grammars = structured.Grammars(path, model.config.vocab_size)
    mask = model.config.mask_token_id
    mask = mask if mask is not None else tokenizer.mask_token_id
    cached, recompute = ReferenceRunner(model), ReferenceRunner(model, use_cache=False)
    eos = eos_token_ids(model, tokenizer)
    got, want, margins, changed = [], [], [], 0
    requests = structured.requests(path)
    for prompt, constraint, max_tokens in [requests[i] for i in range(0, 40, 4)]:
        out = decode(cached, grammars, name, settings, prompt, constraint, max_tokens, eos, mask)
        again = decode(recompute, grammars, name, settings, prompt, constraint, max_tokens, eos, mask)
        accepted, ended, _ = grammars.walk(constraint, out.token_ids)
        assert accepted and (ended or len(out.token_ids) == max_tokens), (name, constraint, out.token_ids)
        got.append(again.token_ids)
        want.append(out.token_ids)
        margins.append(out.margins)
        free = decode(cached, grammars, name, settings, prompt, None, max_tokens, eos, mask)
        changed += free.token_ids != out.token_ids
    ties.compare(got, want, margins)
    assert changed, "the constraint never changed an output"
