"""NLD's draft-only LoRA on SGLang (`diffusion_self` with `draft_adapter`): on in the draft pass only, so greedy
output stays greedy AR's while the verify steps a request takes change with the adapter (it is really applied).

Runs in the SGLang environment (see `tests/sglang/test_sglang_server.py`)."""

import shutil

import sglang

from parallel_decoding.common.checkpoint import load
from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.methods import make_decoder
from parallel_decoding.common.runner import ReferenceRunner
from parallel_decoding.common.sampling import SamplingParams
from scripts.sglang_server import CPU_KWARGS
from tests.support import ties
from tests.support.adapters import write_adapter

MAX_TOKENS = 24


def run(model_dir, config: dict, ids: list[list[int]]) -> tuple[list[list[int]], int]:
    """Greedy tokens and the verify steps all requests took."""
    engine = sglang.Engine(model_path=str(model_dir), decode_mode="diffusion_self", decode_config=config,
                           **CPU_KWARGS)
    try:
        outputs = engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": MAX_TOKENS,
                                                                  "ignore_eos": True})
    finally:
        engine.shutdown()
    return [o["output_ids"] for o in outputs], sum(o["meta_info"].get("spec_verify_ct", 0) for o in outputs)


def test_adapter_in_draft_pass_only(engine_dir, prompts, tmp_path, cpu_engine_env):
    path = tmp_path / "qwen3"
    shutil.copytree(engine_dir["qwen3"], path)
    (path / "lora").mkdir()
    model, tokenizer = load(path)
    write_adapter(model, path / "lora")
    ids = [tokenizer.encode(p) for p in prompts[:8]]
    want = [ReferenceRunner(model).run(make_decoder("ar", None, p, SamplingParams(), Limits(MAX_TOKENS)))
            for p in ids]
    config = {"num_speculative_tokens": 4, "adaptive": False}
    plain, plain_steps = run(path, config, ids)
    adapted, adapted_steps = run(path, {**config, "draft_adapter": "lora"}, ids)
    print(f"verify steps: {plain_steps} without the adapter, {adapted_steps} with it")
    for got in (plain, adapted):
        ties.compare(got, [w.token_ids for w in want], [w.margins for w in want])
    assert adapted_steps > plain_steps
