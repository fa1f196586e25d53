"""SGLang with `--decode-mode` (our plugin, installed in SGLang's own environment) returns, for 32 concurrent
prompts, exactly the tokens of the same server without it (greedy, lossless modes), through `/generate` and the
OpenAI completions API, streamed and not, with stop strings and max_tokens, and under the penalties, `logit_bias` and
`min_new_tokens` (both equal to the reference runner's AR under SGLang's definitions); bad settings are refused at
start.

Runs in the SGLang environment (`scripts/test.sh` sets it up); skipped where SGLang is not installed unless
`PD_REQUIRE_SGLANG=1`, which CI sets so that a missing SGLang fails instead."""

import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from parallel_decoding.common.checkpoint import load
from parallel_decoding.common.sampling import SamplingParams
from scripts.sglang_server import CPU_ARGS, cpu_env, launch_command, sglang_server
from tests.support import ties
from tests.support.reference_cli import HELD, MAX_TOKENS, adjusted_reference, held_reference
from tests.support.sglang_client import generate

MODES = [
    ("diffusion_self", '{"num_speculative_tokens": 4, "adaptive": false}'),
    ("diffusion_self", '{"num_speculative_tokens": 16, "step_cost": [1, 0, 0]}'),
    ("jacobi", '{"block_size": 4, "step_cost": [1, 0, 0]}'),
]


# The penalties and a bias, as SGLang takes them and as `common/` does (SGLang's definitions): the repetition penalty
# apart from the frequency and presence ones, since SGLang's AR applies them in its penalizer set's order without the
# overlap scheduler (after the additive ones with it, and in its speculative path, as `common.penalties` does).
ADJUSTED = [({"repetition_penalty": 1.5, "logit_bias": {"5": 2.0}},
             SamplingParams(repetition_penalty=1.5, logit_bias=((5, 2.0),), rules="sglang")),
            ({"presence_penalty": 0.5, "frequency_penalty": 0.4, "logit_bias": {"5": 2.0}},
             SamplingParams(presence_penalty=0.5, frequency_penalty=0.4, logit_bias=((5, 2.0),),
                            rules="sglang"))]
ADJUSTED_PROMPTS = 4  # per setting


def answers(client, prompts: list[str], stop_tokens: list[int]) -> dict:
    """Every way a client reads the server, for all prompts at once (32 in flight)."""
    with ThreadPoolExecutor(len(prompts)) as pool:
        native = list(pool.map(lambda p: generate(client, p), prompts))
        stops = [out["text"][-12:-8] or "\n" for out in native]
        completions = list(pool.map(
            lambda ps: client.completions.create(model="tiny", prompt=ps[0], max_tokens=MAX_TOKENS, temperature=0,
                                                 stop=[ps[1]]), zip(prompts, stops, strict=True)))
        short = list(pool.map(lambda p: client.completions.create(model="tiny", prompt=p, max_tokens=7,
                                                                  temperature=0), prompts))
        adjusted = [list(pool.map(lambda p, params=params: generate(client, p, **params), prompts[:ADJUSTED_PROMPTS]))
                    for params, _ in ADJUSTED]
        held = list(pool.map(lambda ps: generate(client, ps[0], min_new_tokens=HELD, stop_token_ids=[ps[1]]),
                             zip(prompts, stop_tokens, strict=False)))
    streamed = ["".join(chunk.choices[0].text for chunk in client.completions.create(
        model="tiny", prompt=p, max_tokens=MAX_TOKENS, temperature=0, stream=True)) for p in prompts[:4]]
    chatted = [client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": p}],
                                              max_tokens=MAX_TOKENS, temperature=0).choices[0].message.content
               for p in prompts[:4]]
    return {
        "ids": [out["output_ids"] for out in native],
        "texts": [out["text"] for out in native],
        "stopped": [(c.choices[0].text, c.choices[0].finish_reason, c.usage.completion_tokens) for c in completions],
        "short": [(c.choices[0].text, c.usage.completion_tokens) for c in short],
        "streamed": streamed,
        "chatted": chatted,
        "verify_steps": [out["meta_info"].get("spec_verify_ct") for out in native],
        "adjusted": [[out["output_ids"] for out in outs] for outs in adjusted],
        "held": [out["output_ids"] for out in held],
    }


@pytest.fixture(scope="module")
def adjusted_ar(engine_dir, prompts) -> dict:
    """The reference runner's AR under the penalties and bias, and under `min_new_tokens` (`held_reference`)."""
    stops, held, held_margins = held_reference(engine_dir["qwen3"], None, prompts[:4])
    return {"adjusted": [adjusted_reference(engine_dir["qwen3"], None, prompts[:ADJUSTED_PROMPTS], params)
                         for _, params in ADJUSTED],
            "stops": stops, "held": (held, held_margins)}


def check_adjusted(got: dict, reference: dict) -> None:
    """The penalties, bias and minimum length applied as SGLang's AR applies them."""
    for outputs, (want, margins) in zip(got["adjusted"], reference["adjusted"], strict=True):
        ties.compare(outputs, want, margins)
    ties.compare(got["held"], *reference["held"])


@pytest.fixture(scope="module")
def plain(engine_dir, prompts, adjusted_ar):
    with sglang_server(engine_dir["qwen3"]) as client:
        got = answers(client, prompts, adjusted_ar["stops"])
    check_adjusted(got, adjusted_ar)  # SGLang's AR itself: `common.penalties` has its definitions
    assert all(outputs != got["ids"][:ADJUSTED_PROMPTS] for outputs in got["adjusted"])
    assert all(len(tokens) >= HELD for tokens in got["held"])
    return got


@pytest.mark.parametrize(("mode", "config"), [
    pytest.param(m, c, id=f"{m}-{c}", marks=[pytest.mark.sweep] if "16" in c else [])  # 16 drafts: a wider setting
    for m, c in MODES])
def test_lossless_mode_equals_plain_server(engine_dir, prompts, plain, adjusted_ar, mode, config):
    with sglang_server(engine_dir["qwen3"], mode, config) as client:
        got = answers(client, prompts, adjusted_ar["stops"])
    _, tokenizer = load(engine_dir["qwen3"])
    cuts = ties.compare_greedy(engine_dir["qwen3"], [tokenizer.encode(p) for p in prompts], got["ids"], plain["ids"])
    tied = [cut is not None for cut in cuts]
    ties.compare_untied(got["stopped"], plain["stopped"], tied)
    ties.compare_untied(got["short"], plain["short"], [cut is not None and cut < 7 for cut in cuts])
    ties.compare_untied(got["streamed"], plain["texts"][:4], tied[:4])
    assert plain["streamed"] == plain["texts"][:4]
    assert got["chatted"] == plain["chatted"]
    assert all(len(ids) <= MAX_TOKENS for ids in got["ids"])
    assert sum(got["verify_steps"]) < len(prompts) * (MAX_TOKENS - 1)  # some drafts accepted: windows really ran
    assert all(steps is None for steps in plain["verify_steps"])
    check_adjusted(got, adjusted_ar)


OFF_BY_ONE = """
import parallel_decoding.common.acceptance as acceptance

def accept_one_too_many(drafts, predicted):
    runs = []
    for row, tokens in enumerate(drafts):
        accepted = min(acceptance.leading_matches(acceptance.torch.tensor(tokens, dtype=acceptance.torch.long),
                                                  predicted[row]) + 1, len(tokens))
        runs.append(tokens[:accepted] + [int(predicted[row, accepted])])
    return runs

acceptance.accept_greedy_batch = accept_one_too_many
"""


def test_off_by_one_acceptance_fails_the_comparison(engine_dir, prompts, plain, tmp_path, monkeypatch):
    """The tie-aware comparison still catches a broken acceptance rule: servers whose greedy verification accepts
    the draft at the first mismatch (one draft too many, injected through `sitecustomize`) give ids
    `ties.compare_greedy` rejects."""
    (tmp_path / "sitecustomize.py").write_text(OFF_BY_ONE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    with sglang_server(engine_dir["qwen3"], *MODES[0]) as client, ThreadPoolExecutor(len(prompts)) as pool:
        got = [out["output_ids"] for out in pool.map(lambda p: generate(client, p), prompts)]
    _, tokenizer = load(engine_dir["qwen3"])
    with pytest.raises(AssertionError, match="before any tie"):
        ties.compare_greedy(engine_dir["qwen3"], [tokenizer.encode(p) for p in prompts], got, plain["ids"])


def refusal(args: list[str], model) -> subprocess.CompletedProcess:
    cmd = launch_command(model, None, None, 1, [*CPU_ARGS, *args])
    return subprocess.run(cmd, capture_output=True, text=True, env=cpu_env(), timeout=300, check=False)


@pytest.mark.parametrize(("args", "message"), [
    (["--decode-mode", "assd"], "invalid choice: 'assd'"),
    (["--decode-mode", "jacobi", "--decode-config", "{bad"], "config is not valid JSON"),
    (["--decode-mode", "jacobi", "--decode-config", '{"block_size": 0}'], "block_size must be a positive integer"),
    (["--decode-mode", "diffusion_self", "--decode-config", '{"window": 4}'], "unknown field(s) ['window']"),
    (["--decode-mode", "diffusion_self", "--decode-config", '{"draft_adapter": "lora"}'],
     "draft_adapter must be a PEFT adapter directory"),
    (["--decode-mode", "wedlm", "--page-size", "4"], "page_size must be 1 with decode mode wedlm"),
    (["--decode-config", "{}"], "needs --decode-mode"),
    (["--decode-mode", "huginn"], "decode mode huginn serves RavenForCausalLM checkpoints"),
    (["--decode-mode", "jacobi", "--tp-size", "2"], "tp_size must be 1 with --decode-mode on device cpu"),
], ids=["unknown-mode", "malformed", "bad-value", "unknown-field", "draft-adapter", "paged", "config-without-mode",
        "huginn-on-qwen3", "cpu-tensor-parallel"])
def test_bad_settings_refused_at_start(engine_dir, args, message):
    proc = refusal(args, engine_dir["qwen3"])
    assert proc.returncode != 0
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_model_without_mask_token_refused(engine_dir, tmp_path):
    model = tmp_path / "no-mask"
    shutil.copytree(engine_dir["llama"], model)
    for name, key in (("config.json", "mask_token_id"), ("tokenizer_config.json", "mask_token")):
        data = json.loads((model / name).read_text())
        data.pop(key, None)
        (model / name).write_text(json.dumps(data))
    proc = refusal(["--decode-mode", "diffusion_self"], model)
    assert proc.returncode != 0
    assert "mask_token_id" in proc.stderr and "Traceback" not in proc.stderr
