"""Per-request settings `wedlm`, `diffusion`, `huginn` and quadratic `diffusion_self` do not apply (their decoders
replace vLLM's sampler and its logits processors), refused by name before a request is queued: the offline API
raises, the OpenAI server answers 400. Their decoders apply the penalties, `allowed_token_ids` and `min_tokens`
(`common.penalties`, each slot with the tokens before it as its history), structured output (`common.grammar`,
xgrammar backend only: the constraint travels to the worker in `extra_args`, out of vLLM's scheduler, which would
cut a window at its first mask) and `bad_words` (as vLLM tokenizes them, a grammar too: `common.bad_words`); and
`logit_bias` and `min_p`, which vLLM refuses with any
speculative method (its rejection sampler does not apply them): they travel in `extra_args` too, past that check
(`carry_adjustments`). `logprobs` they report
(`vllm_plugin.logprobs`; `huginn`'s are those of the distribution each token was chosen from), and
`prompt_logprobs` from their causal prefill (all but `wedlm`). Huginn's rows are its in-flight positions, each
with the tokens before it as its history.

The lossless methods are verified by vLLM's own rejection sampler, which applies them to the target, but for
`logit_bias` and `min_p`: those are carried past vLLM's check as well, and applied to the target's logits before the
rejection sampler reads them (`vllm_plugin.proposer.PluginProposer.adjust_targets`; `logprobs` with them refused, as
they would be read from the adjusted logits). Every field of
`vllm.SamplingParams` is in one of three sets below (applied by the decoders, applied by vLLM, refused)."""

import functools
from typing import Any

from parallel_decoding.vllm_plugin.config import ADDITIONAL_CONFIG_KEY

# vLLM sampling parameters the committing methods do not all apply, with the value that leaves them off.
NEUTRAL = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "min_p": 0.0,
           "min_tokens": 0, "logprobs": None, "prompt_logprobs": None, "logprob_token_ids": None,
           "prompt_logprob_token_ids": None, "prompt_logprob_start": None, "structured_outputs": None,
           "logit_bias": None, "allowed_token_ids": None, "bad_words": None, "thinking_token_budget": None,
           "trace_decode_token_ids": None}
# What they report all the same.
REPORTED = {"logprobs", "prompt_logprobs"}
# What the step methods' and Huginn's decoders apply (`common.penalties`, `common.grammar`).
ADJUSTMENTS = {"presence_penalty", "frequency_penalty", "repetition_penalty", "allowed_token_ids", "min_tokens",
               "structured_outputs", "logit_bias", "min_p", "bad_words"}
# Where a committing method's request carries its constraint to the worker: [option name, spec].
GRAMMAR_KEY = "parallel_decoding_grammar"
# Where it carries what vLLM refuses with speculation: {"logit_bias": [[token, bias], ...], "min_p": p}.
CARRIED_KEY = "parallel_decoding_carried"
# What their decoders apply (`vllm_plugin.proposer.request_sampling`), and what vLLM applies outside its sampler
# (fan-out, stop checks, detokenizing, streaming, output formats, its own bookkeeping): every other field of
# `vllm.SamplingParams` is in NEUTRAL (`tests/vllm/test_request_options.py` holds the three sets to vLLM's fields).
APPLIED_BY_DECODERS = {"temperature", "top_p", "top_k", "seed"}
APPLIED_BY_VLLM = {"n", "stop", "stop_token_ids", "ignore_eos", "max_tokens", "detokenize", "skip_special_tokens",
                   "spaces_between_special_tokens", "include_stop_str_in_output", "output_kind", "stream_interval",
                   "output_text_buffer_length", "repetition_detection", "flat_logprobs", "skip_clone",
                   "skip_reading_prefix_cache", "extra_args", "routed_experts_prompt_start", "_eos_token_id",
                   "_all_stop_token_ids", "_watermarking_skipped", "_bad_words_token_ids",
                   "watermarking"}  # only a Model Runner V2 engine watermarks, and ours refuse V2 at startup


def check(method: str, params: Any, committing: bool) -> None:
    """Raise vLLM's validation error naming the first setting `method` would leave unapplied (`committing`: its
    decoder, not vLLM's sampler, picks the tokens)."""
    from vllm.exceptions import VLLMValidationError

    if not committing:
        return
    for name, neutral in NEUTRAL.items():
        if name in REPORTED and not (name == "prompt_logprobs" and method == "wedlm"):
            continue
        if name in ADJUSTMENTS:
            continue
        value = getattr(params, name, neutral)
        if neutral is None:  # set when present and not empty (a dict, a list or an array of token ids)
            on = value is not None and (not hasattr(value, "__len__") or len(value) > 0)
        else:
            on = value != neutral
        if on:
            raise VLLMValidationError(f"{name} is not applied with speculative method {method}: leave it unset "
                                      f"or {neutral!r}, got {value!r}", parameter=name, value=value)


def carry_adjustments(params: Any, vocab_size: int, lossless: bool = False) -> None:
    """Move a committing step method's or a `lossless` method's `logit_bias` and `min_p` into `extra_args` (checked
    here as vLLM would: token ids inside the vocabulary, min_p in [0, 1]), for its decoder, or the lossless target's
    logits (`vllm_plugin.proposer`), to apply, before vLLM's validation, which refuses both with any speculative
    method. A lossless method's logprobs would then be read from the adjusted logits: refused with them. Idempotent:
    an offline batch validates one parameters object per prompt."""
    from vllm.exceptions import VLLMValidationError

    if lossless and params.logprobs is not None and (params.logit_bias or params.min_p):
        name = "logit_bias" if params.logit_bias else "min_p"
        raise VLLMValidationError(f"logprobs are not reported with {name} under a lossless speculative method (vLLM "
                                  f"would read them from the adjusted logits): leave one of them unset",
                                  parameter=name, value=getattr(params, name))

    carried = {}
    if params.logit_bias:
        try:
            bias = sorted((int(token), float(value)) for token, value in params.logit_bias.items())
        except (TypeError, ValueError):
            raise VLLMValidationError(f"logit_bias must map token ids to numbers, got {params.logit_bias!r}",
                                      parameter="logit_bias", value=params.logit_bias) from None
        if any(not 0 <= token < vocab_size for token, _ in bias):
            raise VLLMValidationError(f"logit_bias has token ids outside the vocabulary (size {vocab_size})",
                                      parameter="logit_bias", value=params.logit_bias)
        carried["logit_bias"] = [list(pair) for pair in bias]
        params.logit_bias = None
    if params.min_p:
        if not 0 <= params.min_p <= 1:
            raise VLLMValidationError(f"min_p must be in [0, 1], got {params.min_p}", parameter="min_p",
                                      value=params.min_p)
        carried["min_p"] = float(params.min_p)
        params.min_p = 0.0
    if carried:
        extra = params.extra_args or {}
        params.extra_args = {**extra, CARRIED_KEY: {**extra.get(CARRIED_KEY, {}), **carried}}


def carry_grammar(params: Any, settings: Any) -> None:
    """Move a validated request's structured output (its own copy of the parameters) into `extra_args`, for a
    committing method's decoder to apply in the worker (`vllm_plugin.grammars`). `settings`: the engine's
    `structured_outputs_config`; a reasoning parser that holds the grammar back until the reasoning ends is refused
    (the decoders apply it from the first token)."""
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.structured_output.request import get_structured_output_key

    constraint = params.structured_outputs
    if constraint is None or constraint.all_constraints_none():
        return
    if constraint._backend != "xgrammar":
        raise VLLMValidationError(f"structured_outputs is applied with the xgrammar backend only under a committing "
                                  f"method, got backend {constraint._backend!r}", parameter="structured_outputs")
    if settings.reasoning_parser and not settings.enable_in_reasoning:
        raise VLLMValidationError("structured_outputs is not applied after a reasoning parser's reasoning under a "
                                  "committing method: serve without --reasoning-parser, or with "
                                  "enable_in_reasoning", parameter="structured_outputs")
    option, spec = get_structured_output_key(constraint)
    params.extra_args = {**(params.extra_args or {}), GRAMMAR_KEY: [option.name, spec]}
    params.structured_outputs = None


def install() -> None:
    """Wrap `InputProcessor._validate_params` and `process_inputs` (idempotent); requests to engines without our
    method pass through."""
    from vllm.v1.engine.input_processor import InputProcessor

    validate, process = InputProcessor._validate_params, InputProcessor.process_inputs
    if getattr(validate, "parallel_decoding", False):
        return

    @functools.wraps(validate)
    def validate_ours(self: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        ours = (self.vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
        if ours is not None and hasattr(params, "logprobs"):
            check(ours["method"], params, ours["committing"])
            carry_adjustments(params, self.model_config.get_vocab_size(), lossless=not ours["committing"])
        return validate(self, params, *args, **kwargs)

    @functools.wraps(process)
    def process_ours(self: Any, *args: Any, **kwargs: Any) -> Any:
        request = process(self, *args, **kwargs)
        ours = (self.vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
        if ours is not None and ours["committing"] and request.sampling_params is not None:
            carry_grammar(request.sampling_params, self.vllm_config.structured_outputs_config)
        return request

    validate_ours.parallel_decoding = True
    InputProcessor._validate_params = validate_ours
    InputProcessor.process_inputs = process_ours
