"""vLLM's parsers (as its serving layer gets them) fed token ids in deltas of given sizes, and what a client holds
at the end of such a stream: the reference for every streamed reasoning or tool-call test."""

from collections.abc import Sequence
from typing import Any


def vllms_parser(**names: Any) -> type | None:
    """The parser class vLLM's own `ParserManager.get_parser` composes for `names`, past `vllm_plugin.streaming`'s
    wrapper where an engine of ours in this process installed it."""
    from vllm.parser.parser_manager import ParserManager

    function = ParserManager.__dict__["get_parser"].__func__
    return getattr(function, "__wrapped__", function)(ParserManager, **names)


def parsed_stream(parser_cls: type, tokenizer: Any, ids: Sequence[int], sizes: Sequence[int],
                  tools: list | None = None) -> list[dict]:
    """The messages `parser_cls` streams for `ids` in deltas of `sizes` (cycled), each delta's text its share of the
    decoded whole (special tokens skipped, as the server's default), as dicts."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=tools)
    parser = parser_cls(tokenizer, request.tools)
    ids = list(ids)
    out, start, k = [], 0, 0
    while start < len(ids):
        end = min(len(ids), start + sizes[k % len(sizes)])
        delta = tokenizer.decode(ids[:end], skip_special_tokens=True)[len(tokenizer.decode(
            ids[:start], skip_special_tokens=True)):]
        message = parser.parse_delta(delta_text=delta, delta_token_ids=ids[start:end], request=request,
                                     prompt_token_ids=[1, 2, 3], finished=end == len(ids))
        if message is not None:
            out.append(message.model_dump(exclude_none=True))
        start, k = end, k + 1
    return out


def accumulated(messages: Sequence[Any]) -> dict:
    """What a client holds at the end of a stream (dicts or the `openai` client's deltas): reasoning, content, and
    each tool call's name and arguments."""
    total: dict = {"reasoning": "", "content": "", "calls": {}}
    for message in messages:
        message = message if isinstance(message, dict) else message.model_dump(exclude_none=True)
        total["reasoning"] += message.get("reasoning") or message.get("reasoning_content") or ""
        total["content"] += message.get("content") or ""
        for call in message.get("tool_calls") or []:
            held = total["calls"].setdefault(call["index"], {"name": "", "arguments": ""})
            for key in held:
                held[key] += (call.get("function") or {}).get(key) or ""
    return total
