"""The `parallel-decoding generate` contract later checks rely on. One call goes through `python -m`; the rest call
its `main` in-process (each interpreter start costs more than the decoding it tests)."""

import json
import subprocess
import sys

import pytest

from parallel_decoding.common.generate import main


def generate(json_path, *args: str) -> list[dict]:
    """`parallel-decoding generate *args --json json_path`, in-process; its records."""
    main([*args, "--json", str(json_path)])
    return json.loads(json_path.read_text())


def refused(args: list[str]) -> str:
    """The message `parallel-decoding generate` exits 1 with for these arguments."""
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    return str(exit_info.value.code)

ARGS = {
    "ar": None,
    "jacobi": '{"block_size": 4, "num_blocks": 2, "pool_size": 4}',
    "diffusion_self": '{"num_speculative_tokens": 4}',
    "diffusion": '{"block_size": 8, "confidence_threshold": 0.5}',
    "wedlm": '{"window": 8, "entropy_threshold": 0.4, "distance_penalty": 0.02}',
}


@pytest.fixture(scope="module")
def outputs(tiny_dir, prompts, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    prompts_file = tmp / "prompts.txt"
    prompts_file.write_text("\n".join(prompts[:6]) + "\n")
    results = {}
    for method, config in ARGS.items():
        out = tmp / f"{method}.json"
        args = ["--model", str(tiny_dir / "qwen2"), "--method", method, "--max-tokens", "19", "--prompts-file",
                str(prompts_file)] + (["--config", config] if config else [])
        if method == "ar":
            subprocess.run([sys.executable, "-m", "parallel_decoding.common.generate", *args, "--json", str(out)],
                           check=True, capture_output=True)
            results[method] = json.loads(out.read_text())
        else:
            results[method] = generate(out, *args)
    return prompts[:6], results


def test_records_have_contract_fields(outputs):
    prompts, results = outputs
    for records in results.values():
        assert [r["prompt"] for r in records] == prompts
        for r in records:
            assert {"prompt", "token_ids", "text", "forwards", "tokens_per_forward", "p_cache"} <= set(r)
            assert 1 <= len(r["token_ids"]) <= 19
            assert r["tokens_per_forward"] == pytest.approx(len(r["token_ids"]) / r["forwards"])


def test_lossless_methods_match_ar_through_cli(outputs):
    _, results = outputs
    for method in ("jacobi", "diffusion_self"):
        assert [r["token_ids"] for r in results[method]] == [r["token_ids"] for r in results["ar"]]


def test_huginn_wavefront_through_cli(tiny_dir, prompts, tmp_path):
    """`--method huginn` on the tiny Raven: the records hold `common.huginn.reference.generate`'s tokens and core passes
    for the prompts' token ids, `ar` spends `num_steps` passes per forward, and greedy margins are positive."""
    from transformers import PreTrainedTokenizerFast

    from parallel_decoding.common.decoder import Limits
    from parallel_decoding.common.huginn.config import HuginnConfig
    from parallel_decoding.common.huginn.reference import generate as huginn_generate
    from parallel_decoding.common.models.raven import RavenForCausalLM
    from parallel_decoding.common.sampling import SamplingParams

    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("\n".join(prompts[:3]) + "\n")
    raven = ["--model", str(tiny_dir / "raven"), "--method", "huginn", "--prompts-file", str(prompts_file)]
    settings = {"sampler": "wavefront", "num_steps": 4, "inner_recurrence": 2, "max_diffusion_steps": 16}
    got = {name: generate(tmp_path / f"{name}.json", *raven, "--config", config, "--max-tokens", "9", "--seed", "3")
           for name, config in (("ar", '{"num_steps": 4}'), ("wave", json.dumps(settings)))}
    model = RavenForCausalLM.from_pretrained(tiny_dir / "raven")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tiny_dir / "raven")
    limits = Limits(9, eos_token_ids=tuple(t for t in (tokenizer.eos_token_id,) if t is not None))
    for prompt, record in zip(prompts[:3], got["wave"], strict=True):
        expected = huginn_generate(model, tokenizer.encode(prompt), HuginnConfig(**settings), SamplingParams(seed=3),
                                   limits)
        assert (record["token_ids"], record["core_passes"]) == (expected.token_ids, expected.core_passes)
    assert all(r["core_passes"] == 4 * r["forwards"] for r in got["ar"])
    assert all(len(r["margins"]) == len(r["token_ids"]) and all(m is None or m > 0 for m in r["margins"])
               for r in got["wave"])
    sampled = generate(tmp_path / "sampled.json", *raven, "--config", json.dumps(settings), "--max-tokens", "9",
                       "--temperature", "1.0")
    assert all(r["margins"] == [None] * len(r["token_ids"]) for r in sampled)  # null, not JSON-invalid Infinity
    message = refused([*raven, "--config", '{"sampler": "ar", "exit_t": 0.1}', "--json", str(tmp_path / "bad.json")])
    assert message.startswith("error:") and "exit_t" in message


def test_assd_infilling_through_cli(tiny_dir, tmp_path):
    """`--method assd` fills the mask tokens of a prompt; greedy ASSD equals greedy sequential decoding and takes
    fewer model calls than holes."""
    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("def " + "<|mask|>" * 12 + "(text):\n" + "import <|mask|><|mask|><|mask|>\n")
    xlnet = ["--model", str(tiny_dir / "xlnet"), "--method", "assd", "--prompts-file", str(prompts_file)]
    got = {drafter: generate(tmp_path / f"{drafter}.json", *xlnet, "--config", f'{{"k": 5, "drafter": "{drafter}"}}')
           for drafter in ("self", "none")}
    assert [r["token_ids"] for r in got["self"]] == [r["token_ids"] for r in got["none"]]
    assert [r["generated"] for r in got["none"]] == [12, 3]
    assert all(r["nfe"] <= r["generated"] for r in got["self"]) and got["self"][0]["nfe"] < 12
    assert all("<|mask|>" not in r["text"] for r in got["self"])
    more = generate(tmp_path / "more.json", *xlnet, "--max-tokens", "8")
    assert [r["generated"] for r in more] == [20, 11]  # 8 more holes after each prompt: a continuation
    prompts_file.write_text('{"prompt": "def wrap(text, width):", "holes": [1, 2, -1]}\n')
    explicit = generate(tmp_path / "explicit.json", *xlnet)
    assert explicit[0]["generated"] == 3 and explicit[0]["prompt"] == "def wrap(text, width):"
    prompts_file.write_text("def plain(text):\n")
    assert "has no hole" in refused([*xlnet, "--json", str(tmp_path / "bad.json")])


def test_jsonl_chat_prompts(tmp_path):
    """A `.jsonl` prompts file: a text prompt and a chat (several lines of text) rendered with the chat template."""
    from types import SimpleNamespace

    from parallel_decoding.common.errors import ConfigError
    from parallel_decoding.common.prompts import encode, read_prompts

    path = tmp_path / "prompts.jsonl"
    chat = [{"role": "user", "content": "Two lines:\nhere."}]
    path.write_text(json.dumps({"prompt": "plain"}) + "\n" + json.dumps({"messages": chat}) + "\n")
    assert read_prompts(str(path)) == ["plain", chat]
    rendered = []
    tokenizer = SimpleNamespace(chat_template="T", encode=lambda text: [len(text)],
                                apply_chat_template=lambda m, **kw: rendered.append((m, kw)) or [1, 2, 3])
    assert encode(tokenizer, chat) == [1, 2, 3]
    assert rendered == [(chat, {"add_generation_prompt": True, "tokenize": True})]
    assert encode(tokenizer, "plain") == [5]
    path.write_text('{"messages": "not a list"}\n')
    with pytest.raises(ConfigError, match="line 1 must be"):
        read_prompts(str(path))
    with pytest.raises(ConfigError, match="chat template"):
        encode(SimpleNamespace(chat_template=None), chat)
