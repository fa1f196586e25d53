"""WeDLM checkpoints as shipped (`WeDLMForCausalLM`, model_type `wedlm`, `auto_map`, `mask_token_id: null`, no
remote code needed) serve under vLLM in both shapes and decode exactly as the reference runner."""

import json

import pytest

from tests.vllm_engine import engine  # isort: split

from vllm import SamplingParams

from common.checkpoint import load, resolve_mask_token_id
from common.decoder import Limits
from common.methods import make_decoder, parse_config
from common.runner import ReferenceRunner
from common.sampling import SamplingParams as ReferenceSampling
from scripts.make_tiny_models import as_wedlm
from tests.test_vllm_lossless import MAX_TOKENS

SPEC = {"method": "wedlm", "window": 8, "entropy_threshold": 5.0, "distance_penalty": 0.02}


@pytest.fixture(scope="module", params=["qwen3", "qwen2"], ids=["wedlm-8b-shape", "wedlm-7b-shape"])
def wedlm_dir(request, engine_dir, tmp_path_factory):
    """The tiny Qwen3 (q/k norm) or Qwen2 (qkv bias, `attention_bias: true`) dressed as WeDLM ships."""
    path = as_wedlm(engine_dir[request.param], tmp_path_factory.mktemp("wedlm") / request.param)
    config = json.loads((path / "config.json").read_text())
    config["attention_bias"] = request.param == "qwen2"
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_wedlm_checkpoint_equals_reference(wedlm_dir, prompts):
    model, tokenizer = load(wedlm_dir)
    assert model.config.mask_token_id is None
    mask_id = resolve_mask_token_id(model.config, tokenizer)
    config = parse_config("wedlm", {k: v for k, v in SPEC.items() if k != "method"}, mask_token_id=mask_id)
    expected = [
        ReferenceRunner(model).run(
            make_decoder("wedlm", config, tokenizer.encode(p), ReferenceSampling(), Limits(MAX_TOKENS))
        ).token_ids
        for p in prompts[:8]
    ]
    with engine(wedlm_dir, SPEC) as llm:
        architecture = type(llm.llm_engine.model_executor.driver_worker.worker.model_runner.model).__name__
        got = [list(o.outputs[0].token_ids) for o in llm.generate(prompts[:8], SamplingParams(
            temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))]
    assert got == expected
    shape = json.loads((wedlm_dir / "config.json").read_text())["attention_bias"]
    assert architecture == ("Qwen2ForCausalLM" if shape else "WeDLMForCausalLM")
