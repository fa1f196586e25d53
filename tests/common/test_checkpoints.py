"""Real checkpoints' config shapes load in the reference runner: WeDLM's remote-code config on stock Qwen classes."""

import json
import subprocess
import sys

import torch

from parallel_decoding.common.checkpoint import load, resolve_mask_token_id
from scripts.make_tiny_models import as_wedlm


def logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits


def test_wedlm_8b_shape_loads_as_qwen3(tiny_dir, prompts):
    reference, tokenizer = load(tiny_dir / "qwen3")
    model, wedlm_tokenizer = load(tiny_dir / "wedlm")
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.config.mask_token_id is None
    assert resolve_mask_token_id(model.config, wedlm_tokenizer) == reference.config.mask_token_id
    ids = tokenizer.encode(prompts[0])
    torch.testing.assert_close(logits(model, ids), logits(reference, ids))


def test_wedlm_7b_shape_loads_as_qwen2(tiny_dir, tmp_path, prompts):
    path = as_wedlm(tiny_dir / "qwen2", tmp_path / "wedlm-7b")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "attention_bias": True}))
    reference, tokenizer = load(tiny_dir / "qwen2")
    model, _ = load(path)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    ids = tokenizer.encode(prompts[1])
    torch.testing.assert_close(logits(model, ids), logits(reference, ids))


def test_cli_decodes_wedlm_checkpoint_with_tokenizer_mask(tiny_dir, prompts, tmp_path):
    """The WeDLM-style checkpoint (mask_token_id null) decodes exactly like its Qwen3 twin."""
    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("\n".join(prompts[:3]) + "\n")
    outputs = []
    for name in ("wedlm", "qwen3"):
        out = tmp_path / f"{name}.json"
        proc = subprocess.run(
            [sys.executable, "-m", "parallel_decoding.common.generate", "--model", str(tiny_dir / name),
             "--method", "wedlm",
             "--config", '{"window": 6, "entropy_threshold": 2.0}', "--max-tokens", "17",
             "--prompts-file", str(prompts_file), "--json", str(out)],
            check=True, capture_output=True, text=True, stdin=subprocess.DEVNULL,
        )
        assert "custom code" not in proc.stdout + proc.stderr  # never asks to trust the checkpoint's code
        outputs.append([r["token_ids"] for r in json.loads(out.read_text())])
    assert outputs[0] == outputs[1]


def test_nld_checkpoint_loads_as_ministral3(tiny_dir, prompts):
    """NLD as shipped (`encoder.*`, `diffusion_head`) loads into stock Ministral3 and equals its twin, llama-4 query
    scaling included (the tiny RoPE's original context is 32 positions, the prompt longer)."""
    reference, tokenizer = load(tiny_dir / "ministral3")
    model, _ = load(tiny_dir / "nld")
    assert type(model).__name__ == "Ministral3ForCausalLM"
    assert (model.config.mask_token_id, model.config.dlm_type) == (reference.config.mask_token_id, "llada")
    ids = tokenizer.encode(" ".join(prompts[:3]))
    assert len(ids) > 64
    torch.testing.assert_close(logits(model, ids), logits(reference, ids), rtol=0, atol=0)
