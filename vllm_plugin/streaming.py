"""Streamed reasoning and tool calls under steps of several tokens. vLLM's parsers read a stream delta by delta, and
some mis-split a delta that holds several tokens (granite's reasoning parser passes part of its response marker as
reasoning; vLLM #45588), which any step of our methods may send. In a server running one of our methods, the parser
the serving layer gets reads each such delta token by token, as under AR, and the per-token messages are joined into
one chunk, as a client joins chunks: the streamed reasoning, content and tool calls are those of the tokens one by
one. A delta whose text is not the sum of its tokens' texts (held back for a stop string, an unfinished character)
reaches the parser whole, as before."""

import functools
from collections.abc import Sequence
from typing import Any

# Tokens decoded before a delta's first, so that each token's text is the one it has in context (a leading space).
CONTEXT_TOKENS = 4


def token_texts(decode: Any, context: Sequence[int], ids: Sequence[int], text: str) -> list[str] | None:
    """Each of `ids`' share of `text`, decoded after `context`; None where the shares do not add up to `text`."""
    before = decode(list(context))
    shares = []
    for k in range(1, len(ids) + 1):
        upto = decode([*context, *ids[:k]])
        if not upto.startswith(before):
            return None
        shares.append(upto[len(before):])
        before = upto
    return shares if "".join(shares) == text else None


def joined(messages: list[Any]) -> Any:
    """One message holding `messages` in order, as a client accumulates chunks: text fields concatenated, tool-call
    pieces of one call (one index) merged; None where every message is None."""
    present = [message for message in messages if message is not None]
    if not present:
        return None
    out = present[0].model_copy(deep=True)
    for message in present[1:]:
        for field in ("role", "content", "reasoning"):
            value = getattr(message, field, None)
            if value is not None:
                setattr(out, field, value if field == "role" else (getattr(out, field) or "") + value)
        for call in message.tool_calls:
            last = out.tool_calls[-1] if out.tool_calls else None
            if last is None or last.index != call.index:
                out.tool_calls.append(call.model_copy(deep=True))
                continue
            last.id = _concat(last.id, call.id)
            last.type = call.type or last.type
            if call.function is not None:
                if last.function is None:
                    last.function = call.function.model_copy(deep=True)
                else:
                    last.function.name = _concat(last.function.name, call.function.name)
                    last.function.arguments = _concat(last.function.arguments, call.function.arguments)
    return out


def _concat(a: str | None, b: str | None) -> str | None:
    return a if b is None else (b if a is None else a + b)


def token_by_token(parser_cls: type) -> type:
    """`parser_cls` whose `parse_delta` reads a multi-token delta one token at a time."""
    parse_delta = parser_cls.parse_delta

    def parse_delta_by_token(self: Any, delta_text: str, delta_token_ids: list[int], request: Any,
                             prompt_token_ids: list[int] | None = None, *, finished: bool) -> Any:
        seen = self.__dict__.setdefault("_parallel_decoding_seen", list(prompt_token_ids or [])[-CONTEXT_TOKENS:])
        shares = None
        if len(delta_token_ids) > 1:
            skip = getattr(request, "skip_special_tokens", True)
            shares = token_texts(lambda ids: self.model_tokenizer.decode(ids, skip_special_tokens=skip),
                                 seen[-CONTEXT_TOKENS:], delta_token_ids, delta_text)
        seen.extend(delta_token_ids)
        del seen[:-CONTEXT_TOKENS]
        if shares is None:
            return parse_delta(self, delta_text, delta_token_ids, request, prompt_token_ids, finished=finished)
        last = len(delta_token_ids) - 1
        return joined([parse_delta(self, share, [token], request, prompt_token_ids, finished=finished and k == last)
                       for k, (share, token) in enumerate(zip(shares, delta_token_ids, strict=True))])

    return type(parser_cls.__name__, (parser_cls,), {"parse_delta": parse_delta_by_token,
                                                     "__doc__": parser_cls.__doc__})


def install() -> None:
    """Wrap `ParserManager.get_parser` (idempotent): the serving layer's parsers read deltas token by token."""
    from vllm.parser.parser_manager import ParserManager

    get_parser = ParserManager.__dict__["get_parser"].__func__
    if getattr(get_parser, "parallel_decoding", False):
        return

    @functools.wraps(get_parser)
    def get_parser_by_token(cls: type, *args: Any, **kwargs: Any) -> type | None:
        parser_cls = get_parser(cls, *args, **kwargs)
        return None if parser_cls is None else token_by_token(parser_cls)

    get_parser_by_token.parallel_decoding = True
    ParserManager.get_parser = classmethod(get_parser_by_token)
