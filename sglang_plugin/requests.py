"""Per-request settings our modes do not apply, refused before a request is queued (SGLang answers 400 with the
message) instead of being ignored or failing inside the scheduler. `return_logprob` every mode reports
(`sglang_plugin.logprobs`). Every mode applies min-p (`common.sampling`), the penalties, `logit_bias` and
`min_new_tokens` (`common.penalties`; both by SGLang's definitions, each row with the tokens before it as its history:
a chain's drafts, a window's fills, Huginn's in-flight positions), and structured output (`common.grammar`: the
verify worker with SGLang's grammar objects, the committing decoders and Huginn's with a copy of them each)."""

from typing import Any

# SGLang sampling parameters our decoders do not apply, with the value that leaves them off.
NEUTRAL_SAMPLING = {"min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
                    "min_new_tokens": 0, "json_schema": None, "regex": None, "ebnf": None, "structural_tag": None,
                    "logit_bias": None, "beam_width": None, "watermark": None}
# What our decoders apply (`sglang_plugin.worker.sampling_of`), and what SGLang applies around them (fan-out, stop
# checks, detokenizing, streaming, its normalised copies; `custom_params` feed a custom logit processor and
# `ebnf_full_assistant` an EBNF grammar, both refused): every field of SGLang's `SamplingParams` is in one of the
# three sets (`tests/sglang/test_sglang_request_options.py`).
APPLIED_BY_DECODERS = {"temperature", "top_p", "top_k", "sampling_seed"}
# What every mode also applies (`sampling_of`: min-p, and with `adjustments=True` the others; Huginn's samplers
# through `common.huginn.decoder.HuginnDecoder.adjust`).
ADJUSTMENTS = {"min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias",
               "min_new_tokens"}
# Structured output, which every mode applies (`sglang_plugin.verify.constrained` and
# `sglang_plugin.commit.own_grammar`, over SGLang's own grammar objects).
GRAMMARS = {"json_schema", "regex", "ebnf", "structural_tag"}
APPLIED_BY_SGLANG = {"max_new_tokens", "stop", "stop_token_ids", "stop_regex", "n", "ignore_eos", "skip_special_tokens",
                     "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "custom_params",
                     "ebnf_full_assistant", "stop_strs", "stop_regex_strs", "stop_str_max_len", "stop_regex_max_len",
                     "is_normalized"}


def check_request(manager: Any, obj: Any, *_: Any, **__: Any) -> None:
    """BEFORE hook on `TokenizerManager._validate_one_request` (one request; does nothing without a mode)."""
    settings = getattr(manager.server_args, "_decode_settings", None)
    if settings is None or not hasattr(obj, "return_logprob"):
        return
    from parallel_decoding.sglang_plugin.cli import decode_settings

    mode, _ = decode_settings(manager.server_args)
    if getattr(obj, "token_ids_logprob", None):
        raise ValueError(f"token_ids_logprob is not supported with --decode-mode {mode}")
    if obj.custom_logit_processor:
        raise ValueError(f"custom_logit_processor is not supported with --decode-mode {mode}")
    params = obj.sampling_params or {}
    for name, neutral in NEUTRAL_SAMPLING.items():
        if name in ADJUSTMENTS | GRAMMARS:
            continue
        value = params.get(name)
        if value is not None and value != neutral and value != {}:
            raise ValueError(f"sampling_params.{name} is not applied with --decode-mode {mode}: leave it unset or "
                             f"{neutral!r}, got {value!r}")
