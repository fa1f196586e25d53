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
    with pytest.raises(VLLMValidationError, match=name):
        check("huginn", params, committing=True)
    if name in ADJUSTMENTS:  # the step methods' decoders apply these (common.penalties)
        check("wedlm", params, committing=True)
    else:
        with pytest.raises(VLLMValidationError, match=name):
            check("wedlm", params, committing=True)
    check("jacobi", params, committing=False)  # the lossless methods leave them to vLLM's rejection sampler
