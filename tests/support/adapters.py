"""Writing a PEFT LoRA adapter for a model, for the draft-adapter tests."""

import json

import torch
from safetensors.torch import save_file


def write_adapter(model, path, prefix: str = "base_model.model.model") -> None:
    """A random PEFT LoRA (r 4) on every layer's `o_proj` of a transformers model, saved in `path`."""
    gen = torch.Generator().manual_seed(0)
    weights = {}
    for i, layer in enumerate(model.model.layers):
        proj = layer.self_attn.o_proj
        name = f"{prefix}.layers.{i}.self_attn.o_proj"
        weights[f"{name}.lora_A.weight"] = torch.randn(4, proj.in_features, generator=gen) * 0.5
        weights[f"{name}.lora_B.weight"] = torch.randn(proj.out_features, 4, generator=gen) * 0.5
    save_file(weights, path / "adapter_model.safetensors")
    (path / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "target_modules": ["o_proj"]}))

