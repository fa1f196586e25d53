"""No request option is silently ignored on vLLM: every field of `vllm.SamplingParams` is applied by the committing
methods' decoders, applied by vLLM outside its sampler, or refused by name (`vllm_plugin.requests`), so a field a
new vLLM adds fails here until it is sorted; and each refused one is refused with its name in the message."""

import numpy as np
import pytest

from parallel_decoding.vllm_plugin.requests import (
    ADJUSTMENTS,
    APPLIED_BY_DECODERS,
    APPLIED_BY_VLLM,
    NEUTRAL,
    REPORTED,
    check,
)

pytest.importorskip("vllm")

REFUSED = set(NEUTRAL) - REPORTED
# A value that turns each refused option on.
ON = {"presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.2, "min_p": 0.1, "min_tokens": 2,
      "logprob_token_ids": [1], "prompt_logprob_token_ids": np.array([[1]]), "prompt_logprob_start": 1,
      "structured_outputs": "json", "logit_bias": {1: 1.0}, "allowed_token_ids": [1, 2], "bad_words": ["x"],
      "thinking_token_budget": 8, "trace_decode_token_ids": [1, 2]}


def test_every_sampling_field_is_applied_or_refused():
    from vllm import SamplingParams

    fields = set(SamplingParams.__struct_fields__)
    sorted_ = APPLIED_BY_DECODERS | APPLIED_BY_VLLM | set(NEUTRAL)
    assert fields - sorted_ == set(), "vLLM fields neither applied nor refused"
    assert sorted_ - fields == set(), "fields vLLM no longer has"
    assert not (APPLIED_BY_DECODERS | APPLIED_BY_VLLM) & set(NEUTRAL)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_each_unapplied_option_is_refused_by_name(name):
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import StructuredOutputsParams

    value = StructuredOutputsParams(json={"type": "object"}) if name == "structured_outputs" else ON[name]
    params = SamplingParams(max_tokens=4)
    setattr(params, name, value)
    if name in ADJUSTMENTS:  # the step methods' and Huginn's decoders apply these (common.penalties, common.grammar)
        check("huginn", params, committing=True)
        check("wedlm", params, committing=True)
    else:
        for method in ("huginn", "wedlm"):
            with pytest.raises(VLLMValidationError, match=name):
                check(method, params, committing=True)
    check("jacobi", params, committing=False)  # the lossless methods leave them to vLLM's rejection sampler


def test_committing_methods_carry_the_grammar_past_the_scheduler():
    """A validated constraint moves into `extra_args` (vLLM's scheduler would check a window's tokens as drafts);
    another backend, or a reasoning parser that holds the grammar back, is refused by name."""
    from types import SimpleNamespace

    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import StructuredOutputsParams

    from parallel_decoding.vllm_plugin.requests import GRAMMAR_KEY, carry_grammar

    plain = SimpleNamespace(reasoning_parser="", enable_in_reasoning=False)

    def params(backend: str) -> SamplingParams:
        constraint = StructuredOutputsParams(regex="[ab]+")
        constraint._backend = backend
        return SamplingParams(structured_outputs=constraint, extra_args={"mine": 1})

    carried = params("xgrammar")
    carry_grammar(carried, plain)
    assert carried.structured_outputs is None and carried.extra_args == {"mine": 1, GRAMMAR_KEY: ["REGEX", "[ab]+"]}
    with pytest.raises(VLLMValidationError, match="structured_outputs"):
        carry_grammar(params("guidance"), plain)
    with pytest.raises(VLLMValidationError, match="structured_outputs"):
        carry_grammar(params("xgrammar"), SimpleNamespace(reasoning_parser="deepseek_r1", enable_in_reasoning=False))
