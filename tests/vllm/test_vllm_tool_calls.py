"""Tool calls through vLLM's OpenAI server under the lossless methods: a named or required tool choice, streamed
(several tokens per step reach the server's tool-call streaming as one delta) and not, returns the same parsed call
(name and arguments) as vLLM's AR server on the real model (SmolLM2-135M-Instruct, float32, the `hermes` parser).
vLLM constrains a forced call to the parser's format through its structured output, which the lossless methods take
(`tests/vllm/test_vllm_structured_output.py`); the committing methods refuse structured output, so a forced tool
choice with them is refused (400)."""

import pytest

from scripts.vllm_server import vllm_server

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                   "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}]
QUESTIONS = ["What's the weather in Paris?", "Is it cold in Oslo today?", "Should I take an umbrella in Lima?"]
CHOICES = [{"type": "function", "function": {"name": "get_weather"}}, "required"]
ARGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--dtype", "float32", "--enforce-eager",
        "--max-model-len", "1024", "--kv-cache-memory-bytes", str(256 << 20)]
METHODS = {
    "jacobi": {"method": "jacobi", "block_size": 8, "adaptive": False},
    "diffusion_self": {"method": "diffusion_self", "num_speculative_tokens": 8, "draft_adapter": "draft_lora",
                       "adaptive": False},
}


def calls(model, spec: dict | None) -> list[tuple[str, str, str, str]]:
    """Per question and tool choice: (name, arguments) not streamed, then (name, arguments) joined from the
    streamed deltas."""
    out = []
    with vllm_server(model, spec, extra_args=ARGS) as client:
        for question, choice in ((q, c) for q in QUESTIONS for c in CHOICES):
            request = {"model": "tiny", "messages": [{"role": "user", "content": question}], "tools": TOOLS,
                       "tool_choice": choice, "max_tokens": 96, "temperature": 0}
            call = client.chat.completions.create(**request).choices[0].message.tool_calls[0].function
            name = arguments = ""
            for chunk in client.chat.completions.create(**request, stream=True):
                for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                    name += delta.function.name or ""
                    arguments += delta.function.arguments or ""
            out.append((call.name, call.arguments, name, arguments))
    return out


@pytest.fixture(scope="module")
def ar(real_model):
    return calls(real_model, None)


@pytest.mark.parametrize("method", [pytest.param(m, marks=pytest.mark.sweep) if m == "diffusion_self" else m
                                    for m in METHODS])
def test_tool_calls_equal_ar(real_model, ar, method):
    got = calls(real_model, METHODS[method])
    assert got == ar
    assert all(name == streamed == "get_weather" and arguments for name, arguments, streamed, _ in got), got
