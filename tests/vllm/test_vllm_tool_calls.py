"""Tool calls through vLLM's OpenAI server under the lossless methods: a named or required tool choice, streamed
(several tokens per step reach the server's tool-call streaming as one delta) and not, returns the same parsed call
(name and arguments) as vLLM's AR server on the real model (SmolLM2-135M-Instruct, float32, the `hermes` parser).
vLLM constrains a forced call to the parser's format through its structured output, which the lossless methods take
(`tests/vllm/test_vllm_structured_output.py`) and the committing methods' decoders apply (`common.grammar`): under
`wedlm` a named call is well formed (the tool's name, arguments that parse as a JSON object). CI runs `wedlm`'s;
the equality with AR (`jacobi`, `diffusion_self`) is a sweep."""

import json

import pytest

from scripts.trained_models import SHIPPED
from scripts.vllm_server import vllm_server
from tests.support.tools import CHOICES, calls

ARGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--dtype", "float32", "--enforce-eager",
        "--max-model-len", "1024", "--kv-cache-memory-bytes", str(256 << 20)]
METHODS = {
    "jacobi": {"method": "jacobi", "block_size": 8, "adaptive": False},
    "diffusion_self": {"method": "diffusion_self", "num_speculative_tokens": 8, "draft_adapter": "draft_lora",
                       "adaptive": False},
}


def served_calls(model, spec: dict | None) -> list[tuple[str, str, str, str]]:
    with vllm_server(model, spec, extra_args=ARGS) as client:
        return calls(client)


@pytest.fixture(scope="module")
def ar(real_model):
    return served_calls(real_model, None)


@pytest.mark.sweep  # two servers; CI's tool call is `wedlm`'s below
@pytest.mark.parametrize("method", list(METHODS))
def test_tool_calls_equal_ar(real_model, ar, method):
    got = served_calls(real_model, METHODS[method])
    assert got == ar
    assert all(name == streamed == "get_weather" and arguments for name, arguments, streamed, _ in got), got


def test_wedlm_tool_calls_well_formed():
    """WeDLM windows on its trained tiny checkpoint: a named tool choice returns a call of that tool whose
    arguments parse as a JSON object, streamed and not. (The hermes format's constraint leaves the arguments' keys
    free, as AR shows; a `required` choice lets this model open call after call up to max_tokens.)"""
    with vllm_server(SHIPPED / "wedlm", {"method": "wedlm", "window": 8}, extra_args=ARGS) as client:
        got = calls(client, CHOICES[:1])
    for name, arguments, streamed_name, streamed in got:
        assert name == streamed_name == "get_weather"
        assert isinstance(json.loads(arguments), dict) and json.loads(streamed) == json.loads(arguments), arguments
