"""Talking to SGLang's native server in the tests: one request, and the settings that force retraction."""

import json
import urllib.request

from scripts.sglang_server import CPU_ARGS
from tests.support.exact import LENGTH, PROMPT
from tests.support.reference_cli import MAX_TOKENS


def generate(client, prompt: str | list[int], **params) -> dict:
    """SGLang's native `/generate` on a text or token-id prompt (token ids and SGLang's own step counts), greedy and
    as long as the reference the tests compare with unless `params` say otherwise."""
    url = str(client.base_url).removesuffix("/").removesuffix("/v1") + "/generate"
    body = json.dumps({"text" if isinstance(prompt, str) else "input_ids": prompt,
                       "sampling_params": {"temperature": 0, "max_new_tokens": MAX_TOKENS, **params}})
    request = urllib.request.Request(url, data=body.encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)


def server_info(client) -> dict:
    """SGLang's `/get_server_info` (its scheduler's `internal_states` carry our worker's entries)."""
    url = str(client.base_url).removesuffix("/").removesuffix("/v1") + "/get_server_info"
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.load(response)


# A pool a few requests fill, and SGLang's admission estimate made optimistic, so running requests get retracted;
# and SGLang's own test switch, which retracts a request every few steps besides.
PRESSURE_ARGS = [*CPU_ARGS, "--max-total-tokens", "256", "--schedule-conservativeness", "0.05"]
PRESSURE_ENV = {"SGLANG_INIT_NEW_TOKEN_RATIO": "0.05", "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS": "4",
                "SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "10"}


def sample(client, params, length: int = LENGTH) -> tuple[int, ...]:
    url = str(client.base_url).removesuffix("/").removesuffix("/v1") + "/generate"
    body = {"input_ids": PROMPT, "sampling_params": {"temperature": params.temperature, "top_p": params.top_p,
                                                      "top_k": params.top_k or -1, "min_p": params.min_p,
                                                      "max_new_tokens": length, "ignore_eos": True}}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return tuple(json.load(response)["output_ids"])

