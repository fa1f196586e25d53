"""A committing method's request grammar in the worker: the constraint `vllm_plugin.requests` carried in
`extra_args`, compiled by vLLM's own xgrammar backend (its compiler cache, whitespace and stop-token settings) into
a matcher of the request's decoder alone (`common.grammar.Matcher`), joined with its bad words as vLLM tokenized
them (`common.bad_words`); the decoder advances it over what it commits."""

from typing import Any

from parallel_decoding.common.bad_words import BadWords
from parallel_decoding.common.grammar import Grammar, Matcher, joint
from parallel_decoding.vllm_plugin.requests import GRAMMAR_KEY


class Grammars:
    """Compiles requests' constraints with one backend, made on the first constrained request."""

    def __init__(self, vllm_config: Any) -> None:
        self.vllm_config = vllm_config
        self.backend: Any = None

    def grammar(self, params: Any) -> Grammar | None:
        """The grammar of the request with sampling `params`: its constraint and its bad words, or None."""
        words = params.bad_words_token_ids
        return joint(self.matcher(params), BadWords(words) if words else None)

    def matcher(self, params: Any) -> Matcher | None:
        """A fresh matcher for the request with sampling `params`, or None where it carries no constraint."""
        carried = (params.extra_args or {}).get(GRAMMAR_KEY)
        if carried is None:
            return None
        import xgrammar as xgr
        from vllm.v1.structured_output.backend_types import StructuredOutputOptions

        option, spec = carried
        stop = set(params.all_stop_token_ids) or None
        compiled = self.compiler().compile_grammar(StructuredOutputOptions[option], spec, stop_token_ids=stop)
        return Matcher(xgr.GrammarMatcher(compiled.ctx, override_stop_tokens=sorted(stop) if stop else None))

    def compiler(self) -> Any:
        if self.backend is None:
            from vllm.tokenizers import cached_tokenizer_from_config
            from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend

            model_config = self.vllm_config.model_config
            self.backend = XgrammarBackend(self.vllm_config, tokenizer=cached_tokenizer_from_config(model_config),
                                           vocab_size=model_config.get_vocab_size())
        return self.backend
