"""The ASSD server (`parallel-decoding assd-server`) with the `openai` client on a tiny XLNet: completions, suffix
insertion, streaming and `/v1/infill` equal `common.assd.decoding.infill` on the same model and seed; stop strings,
EOS and max_tokens cut the text; unapplied options are refused by name; concurrent and abandoned requests lose
nothing."""

import concurrent.futures
import json
import os
import sys
import urllib.request

import httpx
import openai
import pytest
import torch
from transformers import PreTrainedTokenizerFast, XLNetLMHeadModel

from parallel_decoding.common.assd.decoding import AssdConfig, infill, with_holes
from parallel_decoding.common.sampling import SamplingParams
from scripts.server_process import free_port, running_server

CONFIG = AssdConfig(k=5)
PROMPTS = ["def fetch(self, key):", "import os\nclass Loader:", "    return self."]


@pytest.fixture(scope="module")
def xlnet(tiny_dir):
    path = tiny_dir / "xlnet"
    model = XLNetLMHeadModel.from_pretrained(path, dtype=torch.float32).eval()
    return path, model, PreTrainedTokenizerFast.from_pretrained(path)


@pytest.fixture(scope="module")
def client(xlnet):
    port = free_port()
    cmd = [sys.executable, "-m", "parallel_decoding.common.assd.server", "--model", str(xlnet[0]), "--port", str(port),
           "--config", json.dumps({"k": CONFIG.k}), "--max-model-len", "256"]
    with running_server("assd", cmd, port, dict(os.environ), None, timeout=120) as client:
        yield client


def reference(xlnet, prompt: str, max_tokens: int, sampling: SamplingParams, suffix: str = "") -> tuple[str, int]:
    """The completion `infill` gives for prompt + holes + suffix (cut at EOS), and its model calls."""
    _, model, tokenizer = xlnet
    head, tail = tokenizer.encode(prompt), tokenizer.encode(suffix)
    result = infill(model, head + [tokenizer.mask_token_id] * max_tokens + tail, tokenizer.mask_token_id, CONFIG,
                    sampling)
    filled = result.token_ids[len(head) : len(head) + max_tokens]
    if tokenizer.eos_token_id in filled:
        filled = filled[: filled.index(tokenizer.eos_token_id)]
    return tokenizer.decode(filled), result.nfe


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_completion_equals_infill(client, xlnet, prompt):
    response = client.completions.create(model="m", prompt=prompt, max_tokens=24, temperature=0)
    text, nfe = reference(xlnet, prompt, 24, SamplingParams())
    assert response.choices[0].text == text
    assert response.usage.model_extra["nfe"] == nfe <= 24  # Theorem 1: calls never exceed the holes


def test_seeded_sampling_and_suffix_equal_infill(client, xlnet):
    for seed in range(3):
        response = client.completions.create(model="m", prompt=PROMPTS[0], suffix="\n    return key\n", max_tokens=12,
                                             temperature=0.8, top_p=0.9, seed=seed)
        text, _ = reference(xlnet, PROMPTS[0], 12, SamplingParams(temperature=0.8, top_p=0.9, seed=seed),
                            suffix="\n    return key\n")
        assert response.choices[0].text == text


def test_streaming_equals_the_whole_answer(client):
    whole = client.completions.create(model="m", prompt=PROMPTS[1], max_tokens=40, temperature=0)
    chunks = list(client.completions.create(model="m", prompt=PROMPTS[1], max_tokens=40, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert sum(bool(c.choices[0].text) for c in chunks) > 1  # it arrives as the fill settles, not at the end
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_stop_strings_and_max_tokens_cut_the_text(client):
    whole = client.completions.create(model="m", prompt=PROMPTS[0], max_tokens=40, temperature=0).choices[0]
    assert whole.finish_reason in ("length", "stop")
    stop = whole.text[len(whole.text) // 2 : len(whole.text) // 2 + 2]
    assert stop.strip()
    for stream in (False, True):
        response = client.completions.create(model="m", prompt=PROMPTS[0], max_tokens=40, temperature=0, stop=[stop],
                                             stream=stream)
        chunks = list(response) if stream else [response]
        assert "".join(c.choices[0].text for c in chunks) == whole.text[: whole.text.index(stop)]
        assert chunks[-1].choices[0].finish_reason == "stop"


def test_infill_route_fills_the_holes(client, xlnet):
    _, model, tokenizer = xlnet
    mask = tokenizer.mask_token
    text = f"def f(x):\n{mask}{mask}{mask} x{mask}1\n"
    response = httpx.post(str(client.base_url.join("/v1/infill")),
                          json={"prompt": text, "temperature": 0}, timeout=60).json()
    want = infill(model, tokenizer.encode(text), tokenizer.mask_token_id, CONFIG, SamplingParams())
    assert response["text"] == tokenizer.decode(want.token_ids)
    assert len(response["fills"]) == response["usage"]["completion_tokens"] == 4
    assert response["usage"]["nfe"] == want.nfe
    text = "def fetch(self, key):\n    return self.cache[key]\n"
    response = httpx.post(str(client.base_url.join("/v1/infill")),
                          json={"prompt": text, "holes": [1, 2, -3], "temperature": 0}, timeout=60).json()
    want = infill(model, with_holes(tokenizer.encode(text), [1, 2, -3], tokenizer.mask_token_id),
                  tokenizer.mask_token_id, CONFIG, SamplingParams())
    assert response["text"] == tokenizer.decode(want.token_ids) and len(response["fills"]) == 3


@pytest.mark.parametrize("extra,name", [
    ({"n": 2}, "n"), ({"logprobs": 1}, "logprobs"), ({"echo": True}, "echo"), ({"presence_penalty": 0.5},
    "presence_penalty"), ({"extra_body": {"min_p": 0.1}}, "min_p"),
])
def test_unapplied_options_refused_by_name(client, extra, name):
    with pytest.raises(openai.BadRequestError, match=name):
        client.completions.create(model="m", prompt=PROMPTS[0], max_tokens=4, **extra)


def test_bad_input_refused(client, xlnet):
    tokenizer = xlnet[2]
    with pytest.raises(openai.BadRequestError, match="infill"):
        client.completions.create(model="m", prompt=f"a {tokenizer.mask_token} b", max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="max_model_len"):
        client.completions.create(model="m", prompt=PROMPTS[0], max_tokens=400)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model="m", prompt=PROMPTS[0], max_tokens=0)
    url = str(client.base_url.join("/v1/infill"))
    for body, name in (({"prompt": "no holes"}, "hole"), ({"prompt": f"a{tokenizer.mask_token}", "max_tokens": 3},
                                                           "max_tokens"), ({"prompt": "ab", "holes": [99]}, "holes")):
        response = httpx.post(url, json=body, timeout=60)
        assert response.status_code == 400 and name in response.json()["error"]["message"]


def test_concurrent_and_abandoned_requests_lose_nothing(client, xlnet):
    stream = client.completions.create(model="m", prompt=PROMPTS[2], max_tokens=60, temperature=0, stream=True)
    next(iter(stream))
    stream.response.close()  # the client goes away mid-stream
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda p: client.completions.create(model="m", prompt=p, max_tokens=16,
                                                                    temperature=0).choices[0].text, PROMPTS * 2))
    assert answers == [reference(xlnet, p, 16, SamplingParams())[0] for p in PROMPTS * 2]
    metrics = urllib.request.urlopen(str(client.base_url.join("/metrics"))).read().decode()
    counts = dict(line.split() for line in metrics.splitlines() if not line.startswith("#"))
    assert int(counts["assd_requests_total"]) >= 6 and 0 < int(counts["assd_nfe_total"]) <= int(
        counts["assd_tokens_total"])
