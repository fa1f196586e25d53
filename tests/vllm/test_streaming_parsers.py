"""vLLM's own parsers (`ParserManager`, as its serving layer gets them) reading a stream in multi-token deltas, as our
methods' steps send it: with `vllm_plugin.streaming` the streamed reasoning, content and tool calls equal those of
the same tokens one delta each (AR's stream); without it, vLLM's granite reasoning parser mis-splits them."""

import pytest
from transformers import AutoTokenizer

from scripts.trained_models import SHIPPED
from tests.support.parsers import accumulated, parsed_stream, vllms_parser

REASONING = "Here is my thought process: the sky looks blue by day Here is my response: It is blue."
TOOL_CALL = '[get_weather(city="Paris", unit="celsius")]'
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(SHIPPED / "wedlm")


def parsers(**names) -> tuple[type, type]:
    """vLLM's parser class for `names`, and the same reading deltas token by token."""
    from parallel_decoding.vllm_plugin import streaming

    plain = vllms_parser(**names)
    return plain, streaming.token_by_token(plain)


def stream(parser_cls, tokenizer, text: str, sizes: list[int], tools=None) -> dict:
    return accumulated(parsed_stream(parser_cls, tokenizer, tokenizer.encode(text, add_special_tokens=False), sizes,
                                     tools))


@pytest.mark.parametrize("sizes", [[3], [5, 2, 7], [9]])
def test_granite_reasoning_streams_as_token_by_token(tokenizer, sizes):
    plain, ours = parsers(reasoning_parser_name="granite")
    ar = stream(plain, tokenizer, REASONING, [1])
    assert "the sky looks blue by day" in ar["reasoning"] and ar["content"].strip() == "It is blue.", ar
    assert stream(ours, tokenizer, REASONING, sizes) == ar
    assert stream(ours, tokenizer, REASONING, [1]) == ar


def test_vllms_granite_parser_mis_splits_multi_token_deltas(tokenizer):
    """Why the wrapper exists (vLLM 0.32): the same stream in 3-token deltas gives other reasoning. Should vLLM fix
    its parser, this fails and the wrapper may go."""
    plain, _ = parsers(reasoning_parser_name="granite")
    assert stream(plain, tokenizer, REASONING, [3]) != stream(plain, tokenizer, REASONING, [1])


@pytest.mark.parametrize("sizes", [[4], [2, 9]])
def test_tool_calls_stream_as_token_by_token(tokenizer, sizes):
    """The wrapper joins a step's tool-call pieces into one chunk as a client joins them."""
    plain, ours = parsers(tool_parser_name="pythonic", enable_auto_tools=True)
    ar = stream(plain, tokenizer, TOOL_CALL, [1], TOOLS)
    assert ar["calls"] == {0: {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}
    assert stream(ours, tokenizer, TOOL_CALL, sizes, TOOLS) == ar


def test_a_delta_whose_text_is_not_its_tokens_reaches_the_parser_whole(tokenizer):
    from parallel_decoding.vllm_plugin.streaming import token_texts

    decode = tokenizer.decode
    ids = tokenizer.encode(" the sky is blue", add_special_tokens=False)
    assert "".join(token_texts(decode, [], ids, decode(ids))) == decode(ids)
    assert token_texts(decode, [], ids, decode(ids)[:-2]) is None  # held back for a stop string


def test_an_engine_of_ours_gives_the_serving_layer_token_by_token_parsers(monkeypatch):
    """What the server's processes run: configuring an engine with one of our methods wraps `get_parser`."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.parser.parser_manager import ParserManager

    monkeypatch.setattr(ParserManager, "get_parser", ParserManager.__dict__["get_parser"])  # restored after
    args = EngineArgs(model=str(SHIPPED / "wedlm"), speculative_config={"method": "wedlm", "window": 8},
                      enforce_eager=True, max_model_len=512, kv_cache_memory_bytes=64 << 20)
    args.create_engine_config()
    granite = ParserManager.get_parser(reasoning_parser_name="granite")
    assert granite.parse_delta.__name__ == "parse_delta_by_token"
    assert granite.reasoning_parser_cls is vllms_parser(reasoning_parser_name="granite").reasoning_parser_cls
