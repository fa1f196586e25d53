"""NLD's draft-only LoRA on vLLM (`diffusion_self` with `draft_adapter`, a directory relative to the checkpoint or
absolute): on in the draft pass only, so greedy output stays greedy AR's while acceptance changes with the adapter
(it is really applied); refused without eager mode, and when the directory is not a PEFT adapter."""

import shutil

import pytest

from tests.support.vllm_engine import engine  # isort: split

from vllm import SamplingParams

from parallel_decoding.common.checkpoint import load
from parallel_decoding.common.errors import ConfigError
from parallel_decoding.vllm_plugin.metrics import acceptance
from tests.support import ties
from tests.support.adapters import write_adapter

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def served(engine_dir, tmp_path_factory):
    """A copy of the tiny Qwen3 with a random draft LoRA in its own `lora/` directory."""
    path = tmp_path_factory.mktemp("adapted") / "qwen3"
    shutil.copytree(engine_dir["qwen3"], path)
    (path / "lora").mkdir()
    write_adapter(load(path)[0], path / "lora")
    return path


def run(model_dir, spec: dict | None, prompts: list[str]) -> tuple[list[list[int]], int]:
    with engine(model_dir, spec) as llm:
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True),
                               use_tqdm=False)
        accepted = 0 if spec is None else sum(acceptance(llm).accepted_per_position)
    return [list(o.outputs[0].token_ids) for o in outputs], accepted


def test_adapter_in_draft_pass_only(served, prompts):
    prompts = prompts[:8]
    plain_spec = {"method": "diffusion_self", "num_speculative_tokens": 4, "adaptive": False}  # every step drafts
    ar, _ = run(served, None, prompts)
    plain, accepted_plain = run(served, plain_spec, prompts)
    adapted, accepted_adapted = run(served, {**plain_spec, "draft_adapter": "lora"}, prompts)
    tied = [tie is not None for tie in ties.reference_ties(served, "diffusion_self", {}, prompts, MAX_TOKENS)]
    ties.compare_untied(adapted, ar, tied)
    ties.compare_untied(plain, ar, tied)
    print(f"accepted drafts: {accepted_plain} without the adapter, {accepted_adapted} with it")
    assert accepted_adapted != accepted_plain


@pytest.mark.parametrize(("adapter", "kwargs", "message"), [
    ("lora", {"enforce_eager": False}, "enforce_eager"),
    ("missing", {}, "PEFT adapter directory"),
])
def test_refused(served, adapter, kwargs, message):
    with pytest.raises(ConfigError, match=message), engine(
            served, {"method": "diffusion_self", "num_speculative_tokens": 4, "draft_adapter": adapter}, **kwargs):
        pass
