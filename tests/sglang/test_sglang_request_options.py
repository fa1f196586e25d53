"""No request option is silently ignored on SGLang: every field of SGLang's `SamplingParams` is applied by our
decoders, applied by SGLang around them, or refused by name (`sglang_plugin.requests`), so a field a new SGLang adds
fails here until it is sorted; and each refused one is refused with its name in the message.

Runs in the SGLang environment; skipped where SGLang is not installed unless `PD_REQUIRE_SGLANG=1`."""

from types import SimpleNamespace

import pytest

from parallel_decoding.common.jacobi import JacobiConfig
from parallel_decoding.sglang_plugin.requests import (
    ADJUSTMENTS,
    APPLIED_BY_DECODERS,
    APPLIED_BY_SGLANG,
    GRAMMARS,
    NEUTRAL_SAMPLING,
    check_request,
)

# A value that turns each refused option on.
ON = {"min_p": 0.1, "frequency_penalty": 0.5, "presence_penalty": 0.5, "repetition_penalty": 1.2,
      "min_new_tokens": 2, "json_schema": '{"type": "object"}', "regex": "[ab]+", "ebnf": 'root ::= "a"',
      "structural_tag": "{}", "logit_bias": {"1": 1.0}, "beam_width": 2, "watermark": {"key": 1}}


def test_every_sampling_field_is_applied_or_refused():
    from sglang.srt.sampling.sampling_params import SamplingParams

    fields = set(SamplingParams.__struct_fields__)
    sorted_ = APPLIED_BY_DECODERS | APPLIED_BY_SGLANG | set(NEUTRAL_SAMPLING)
    assert fields - sorted_ == set(), "SGLang fields neither applied nor refused"
    assert sorted_ - fields == set(), "fields SGLang no longer has"
    assert not (APPLIED_BY_DECODERS | APPLIED_BY_SGLANG) & set(NEUTRAL_SAMPLING)


@pytest.mark.parametrize("name", sorted(NEUTRAL_SAMPLING))
def test_each_unapplied_option_is_refused_by_name(name, monkeypatch):
    from parallel_decoding.sglang_plugin import cli

    manager = SimpleNamespace(server_args=SimpleNamespace(_decode_settings="{}"))
    request = SimpleNamespace(return_logprob=False, custom_logit_processor=None, sampling_params={name: ON[name]})
    # one verifying mode, one whose decoder commits, Huginn's own worker
    for mode, config in [("jacobi", JacobiConfig()), ("wedlm", None), ("huginn", None)]:
        monkeypatch.setattr(cli, "decode_settings", lambda args, mode=mode, config=config: (mode, config))
        if name in ADJUSTMENTS | GRAMMARS:
            check_request(manager, request)
        else:
            with pytest.raises(ValueError, match=name):
                check_request(manager, request)
    check_request(manager, SimpleNamespace(return_logprob=False, custom_logit_processor=None, sampling_params={}))
