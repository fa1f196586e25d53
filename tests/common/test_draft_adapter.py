"""NLD's draft-only LoRA: active in draft forwards only, so self-speculation stays exactly greedy AR."""

import contextlib
import json

import pytest
import torch
from safetensors.torch import save_file

from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.diffusion_self import DRAFT_ADAPTER
from parallel_decoding.common.errors import ConfigError
from parallel_decoding.common.lora import LoRA
from parallel_decoding.common.methods import make_decoder, parse_config
from parallel_decoding.common.runner import ReferenceRunner
from parallel_decoding.common.sampling import SamplingParams
from parallel_decoding.common.window import Attention
from tests.support import ties
from tests.support.adapters import write_adapter


@pytest.fixture(scope="module")
def adapter_dir(qwen3, tmp_path_factory):
    path = tmp_path_factory.mktemp("lora")
    write_adapter(qwen3[0], path)
    return path


def test_adapter_only_in_draft_forwards_and_lossless(qwen3, prompts, adapter_dir):
    model, tokenizer = qwen3
    lora = LoRA(model, adapter_dir)
    seen: list[Attention] = []

    @contextlib.contextmanager
    def recording():
        seen.append(current[0].attention)
        with lora.enabled():
            yield

    config = parse_config("diffusion_self", {"num_speculative_tokens": 5, "draft_adapter": str(adapter_dir)},
                          mask_token_id=model.config.mask_token_id)
    runner = ReferenceRunner(model, adapters={DRAFT_ADAPTER: recording})
    changed = 0
    got, want = [], []
    for prompt in prompts[:8]:
        ids = tokenizer.encode(prompt)
        ar = ReferenceRunner(model).run(make_decoder("ar", None, ids, SamplingParams(), Limits(25)))
        decoder = make_decoder("diffusion_self", config, ids, SamplingParams(), Limits(25))
        current: list = [None]
        original = decoder.next_forward

        def spy(original=original, current=current):
            current[0] = original()
            return current[0]

        decoder.next_forward = spy
        seen.clear()
        result = runner.run(decoder)
        got.append(result.token_ids)
        want.append(ar)
        assert seen and all(attention is Attention.BIDIRECTIONAL for attention in seen)
        assert len(seen) == (result.forwards - 1) // 2
        draft = make_decoder("diffusion_self", config, ids, SamplingParams(), Limits(25))
        draft.apply(ReferenceRunner(model).logits(draft.next_forward(), draft, None))
        forward = draft.next_forward()
        plain = ReferenceRunner(model).logits(forward, draft, None)
        with lora.enabled():
            adapted = ReferenceRunner(model).logits(forward, draft, None)
        changed += not torch.equal(plain.argmax(-1), adapted.argmax(-1))
    assert changed > 0
    ties.compare(got, [ar.token_ids for ar in want], [ar.margins for ar in want])


def test_bad_adapter_path_is_refused(qwen3, tmp_path):
    with pytest.raises(ConfigError, match="draft_adapter"):
        LoRA(qwen3[0], tmp_path / "missing")


def test_nld_module_names_map_onto_the_stock_model(qwen3, tmp_path):
    """An adapter saved against NLD's own module names (`encoder.*`, as `linear_spec_lora/` is) targets the stock
    model's modules."""
    write_adapter(qwen3[0], tmp_path, prefix="base_model.model.encoder")
    assert len(LoRA(qwen3[0], tmp_path).deltas) == len(qwen3[0].model.layers)


class Fused(torch.nn.Module):
    """An engine-style attention block: q, k and v in one `qkv_proj` whose output is [q | k | v] (`output_sizes`)."""

    def __init__(self, q: torch.nn.Linear, k: torch.nn.Linear, v: torch.nn.Linear) -> None:
        super().__init__()
        self.qkv_proj = torch.nn.Linear(q.in_features, q.out_features + k.out_features + v.out_features, bias=False)
        self.qkv_proj.weight.data = torch.cat([q.weight, k.weight, v.weight]).detach()
        self.qkv_proj.output_sizes = [q.out_features, k.out_features, v.out_features]


def test_adapter_on_fused_projections_equals_the_unfused_one(tmp_path):
    """A PEFT LoRA on q_proj and v_proj (k untouched) applied to an engine's fused `qkv_proj` adds exactly what it
    adds to the separate projections, each in its slice."""
    gen = torch.Generator().manual_seed(0)
    attn = torch.nn.Module()
    attn.q_proj, attn.k_proj, attn.v_proj = (torch.nn.Linear(16, n, bias=False) for n in (16, 8, 8))
    unfused = torch.nn.Module()
    unfused.attn = attn
    fused = torch.nn.Module()
    fused.attn = Fused(attn.q_proj, attn.k_proj, attn.v_proj)
    weights = {}
    for name, out in (("q_proj", 16), ("v_proj", 8)):
        weights[f"base_model.model.attn.{name}.lora_A.weight"] = torch.randn(4, 16, generator=gen)
        weights[f"base_model.model.attn.{name}.lora_B.weight"] = torch.randn(out, 4, generator=gen)
    save_file(weights, tmp_path / "adapter_model.safetensors")
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8,
                                                              "target_modules": ["q_proj", "v_proj"]}))
    x = torch.randn(3, 16, generator=gen)
    with LoRA(unfused, tmp_path).enabled():
        want = torch.cat([attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)], -1)
    with LoRA(fused, tmp_path).enabled():
        got = fused.attn.qkv_proj(x)
    torch.testing.assert_close(got, want)
    assert not torch.equal(got, fused.attn.qkv_proj(x)), "the adapter changed nothing"
    fused.attn.qkv_proj.tp_size = 2
    with pytest.raises(ConfigError, match="tensor_parallel_size 1"):
        LoRA(fused, tmp_path)


def test_row_scoped_adapter_leaves_other_rows_exact(qwen3, adapter_dir):
    """`LoRA.enabled(rows)`: the rows named change, the others are bit for bit the base model's; a quadratic
    forward with a draft adapter names exactly its group rows (the chain's verify the base model's)."""
    from parallel_decoding.common.quadratic_self_spec import QuadraticSelfSpecConfig, quadratic_forward

    model, _ = qwen3
    lora = LoRA(model, adapter_dir)
    config = QuadraticSelfSpecConfig(block_size=3, mask_token_id=model.config.mask_token_id,
                                     draft_adapter=str(adapter_dir))
    forward = quadratic_forward([5, 6, 7], 10, config)
    assert forward.adapter == DRAFT_ADAPTER
    assert forward.adapter_rows.tolist() == list(range(3, 3 + 3 * 4))
    assert quadratic_forward([5, 6, 7], 10, config, grouped=False).adapter is None
    ids = torch.tensor([[3, 9, 4, 11, 7, 2]])
    with torch.inference_mode():
        base = model(input_ids=ids).logits
        with lora.enabled(torch.tensor([4, 5])):
            scoped = model(input_ids=ids).logits
    assert torch.equal(scoped[0, :4], base[0, :4])  # causal: rows before 4 see no adapted row
    assert not torch.allclose(scoped[0, 4:], base[0, 4:])
