"""Reasoning through SGLang's OpenAI server under the decode modes, whose steps reach the reasoning parser as
multi-token deltas (vLLM #45588: a diffusion model's deltas broke vLLM's parsers). A regex makes every answer reason
first ("<think>...</think>..."), and SGLang's `qwen3` parser, which reads those tags in the text (any tokenizer),
splits it; `enable_thinking: false` has SGLang apply the grammar from the first token (with thinking on, it would
wait for the reasoning to end). On the real model (SmolLM2-135M-Instruct, float32) `jacobi` and `diffusion_self`
give AR's reasoning and content exactly, streamed and not; under `wedlm` on its trained tiny checkpoint the split is
well formed (the text the regex allows, both parts present) and the stream adds up to the whole message. The twin of
`tests/vllm/test_vllm_reasoning.py`; a sweep (four servers).

Runs in the SGLang environment (see `tests/sglang/test_sglang_server.py`)."""

import json
import re

import pytest

from scripts.sglang_server import CPU_ARGS, sglang_server
from scripts.trained_models import SHIPPED
from tests.support.parsers import accumulated

pytestmark = pytest.mark.sweep
ARGS = [*CPU_ARGS, "--reasoning-parser", "qwen3", "--context-length", "1024"]
PATTERN = r"<think>[a-z ]{6,30}</think>[A-Za-z ]{4,30}\."
QUESTIONS = ["What's the weather in Paris?", "Name a color.", "Why is the sky blue?"]
MODES = {
    "jacobi": {"block_size": 8, "adaptive": False},
    "diffusion_self": {"num_speculative_tokens": 8, "draft_adapter": "draft_lora", "adaptive": False},
}


def answers(client) -> list[dict]:
    """Per question: the whole message's reasoning and content, and what the streamed deltas add up to."""
    out = []
    for question in QUESTIONS:
        request = {"model": "tiny", "messages": [{"role": "user", "content": question}], "max_tokens": 160,
                   "temperature": 0}
        extra = {"regex": PATTERN, "chat_template_kwargs": {"enable_thinking": False}, "separate_reasoning": True}
        whole = client.chat.completions.create(**request, extra_body=extra).choices[0].message
        stream = client.chat.completions.create(**request, extra_body=extra, stream=True)
        out.append({"whole": accumulated([whole]),
                    "streamed": accumulated([chunk.choices[0].delta for chunk in stream if chunk.choices])})
    return out


def served(model, mode: str | None, config: dict | None) -> list[dict]:
    with sglang_server(model, mode, None if config is None else json.dumps(config), ARGS) as client:
        return answers(client)


@pytest.fixture(scope="module")
def ar(real_model):
    return served(real_model, None, None)


@pytest.mark.parametrize("mode", list(MODES))
def test_reasoning_equals_ar(real_model, ar, mode):
    assert all(answer["whole"]["reasoning"] and answer["whole"]["content"] for answer in ar), ar
    assert all(answer["streamed"] == answer["whole"] for answer in ar), ar
    assert served(real_model, mode, MODES[mode]) == ar


def test_wedlm_reasoning_well_formed():
    """WeDLM windows on its trained tiny checkpoint: reasoning and content the regex allows, streamed as whole."""
    for answer in served(SHIPPED / "wedlm", "wedlm", {"window": 8}):
        whole = answer["whole"]
        assert re.fullmatch(PATTERN, f"<think>{whole['reasoning']}</think>{whole['content']}"), answer
        assert answer["streamed"] == whole, answer
