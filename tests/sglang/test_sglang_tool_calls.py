"""Tool calls through SGLang's OpenAI server: a named or required tool choice, streamed (several tokens per step
reach the server's tool-call streaming at once) and not, returns the same parsed call (name and arguments) under
`jacobi` as SGLang's AR server on the real model (SmolLM2-135M-Instruct, float32, the `hermes` parser), and a
well-formed one under `wedlm` on its trained tiny checkpoint (the tool's name, arguments that parse as JSON: SGLang's
constraint for the format leaves their shape free, as vLLM's does). SGLang constrains a forced call through its
structured output, which every mode applies (`tests/sglang/test_sglang_structured_output.py`).
The twin of `tests/vllm/test_vllm_tool_calls.py`; a sweep (three servers).

Runs in the SGLang environment (see `tests/sglang/test_sglang_server.py`)."""

import json

import pytest

from scripts.sglang_server import CPU_ARGS, sglang_server
from scripts.trained_models import SHIPPED
from tests.support.tools import CHOICES, calls

pytestmark = pytest.mark.sweep
ARGS = [*CPU_ARGS, "--tool-call-parser", "hermes", "--context-length", "1024"]


def served_calls(model, mode: str | None, config: dict | None, choices: list = CHOICES
                 ) -> list[tuple[str, str, str, str]]:
    with sglang_server(model, mode, None if config is None else json.dumps(config), ARGS) as client:
        return calls(client, choices)


def test_jacobi_tool_calls_equal_ar(real_model):
    got = served_calls(real_model, "jacobi", {"block_size": 8, "adaptive": False})
    assert got == served_calls(real_model, None, None)
    assert all(name == streamed == "get_weather" for name, _, streamed, _ in got), got


def test_wedlm_tool_calls_well_formed():
    for name, arguments, streamed_name, streamed in served_calls(SHIPPED / "wedlm", "wedlm", {"window": 8},
                                                                 CHOICES[:1]):
        assert name == streamed_name == "get_weather"
        assert json.loads(streamed) == json.loads(arguments), arguments  # JSON (the format leaves its shape free)
