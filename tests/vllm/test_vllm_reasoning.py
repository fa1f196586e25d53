"""Reasoning through vLLM's OpenAI server under the parallel methods, whose steps reach the reasoning parser as
multi-token deltas (vLLM #45588: a diffusion model's deltas broke the parsers; vLLM's granite parser mis-splits
them, `tests/vllm/test_streaming_parsers.py`). A regex makes every answer reason first ("Here is my thought process:
... Here is my response: ..."; structured output inside the reasoning, `enable_in_reasoning`), and vLLM's `granite`
parser, which reads those phrases in the text (no special token, so any tokenizer), splits it. Under `wedlm` on its
trained tiny checkpoint (CI) the streamed reasoning and content are those of its tokens streamed one by one, as AR
streams; on the real model (SmolLM2-135M-Instruct, float32) `jacobi` and `diffusion_self` give AR's tokens,
reasoning and content exactly, streamed and not (a sweep: three servers)."""

import re

import pytest
from transformers import AutoTokenizer

from scripts.trained_models import SHIPPED
from scripts.vllm_server import vllm_server
from tests.support.parsers import accumulated, parsed_stream, vllms_parser

ARGS = ["--reasoning-parser", "granite", "--structured-outputs-config", '{"enable_in_reasoning": true}',
        "--dtype", "float32", "--enforce-eager", "--max-model-len", "1024", "--kv-cache-memory-bytes", str(256 << 20)]
PATTERN = r"Here is my thought process:[a-z ]{6,30}Here is my response:[A-Za-z ]{4,30}\."
QUESTIONS = ["What's the weather in Paris?", "Name a color.", "Why is the sky blue?"]
METHODS = {
    "jacobi": {"method": "jacobi", "block_size": 8, "adaptive": False},
    "diffusion_self": {"method": "diffusion_self", "num_speculative_tokens": 8, "draft_adapter": "draft_lora",
                       "adaptive": False},
}


def answers(client) -> list[dict]:
    """Per question: the whole message's token ids, reasoning and content, and what the streamed deltas add up to."""
    out = []
    for question in QUESTIONS:
        request = {"model": "tiny", "messages": [{"role": "user", "content": question}], "max_tokens": 160,
                   "temperature": 0}
        constraint = {"structured_outputs": {"regex": PATTERN}}
        choice = client.chat.completions.create(**request, extra_body={**constraint, "return_token_ids": True})
        choice = choice.choices[0]
        stream = client.chat.completions.create(**request, extra_body=constraint, stream=True)
        out.append({"ids": choice.token_ids, "whole": accumulated([choice.message]),
                    "streamed": accumulated([chunk.choices[0].delta for chunk in stream if chunk.choices])})
    return out


def served(model, spec: dict | None) -> list[dict]:
    with vllm_server(model, spec, extra_args=ARGS) as client:
        return answers(client)


@pytest.fixture(scope="module")
def ar(real_model):
    return served(real_model, None)


@pytest.mark.sweep  # three servers on the real model; CI's reasoning test is `wedlm`'s below
@pytest.mark.parametrize("method", list(METHODS))
def test_reasoning_equals_ar(real_model, ar, method):
    assert all(answer["whole"]["reasoning"] and answer["whole"]["content"] for answer in ar), ar
    assert served(real_model, METHODS[method]) == ar


def test_wedlm_reasoning_streams_as_its_tokens_one_by_one():
    """WeDLM windows on its trained tiny checkpoint: the text the regex allows, and a stream that adds up to what
    vLLM's parser streams for the same tokens one at a time (fails with `vllm_plugin.streaming` off)."""
    with vllm_server(SHIPPED / "wedlm", {"method": "wedlm", "window": 8}, extra_args=ARGS) as client:
        got = answers(client)
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED / "wedlm")
    granite = vllms_parser(reasoning_parser_name="granite")
    for answer in got:
        assert re.fullmatch(PATTERN, tokenizer.decode(answer["ids"], skip_special_tokens=True)), answer
        assert answer["whole"]["reasoning"] and answer["whole"]["content"], answer
        assert answer["streamed"] == accumulated(parsed_stream(granite, tokenizer, answer["ids"], [1])), answer
