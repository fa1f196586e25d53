"""A PEFT-format LoRA switched on only inside a context: NLD's draft-only adapter (on `o_proj`)."""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file

from common.errors import ConfigError


def delta_hook(down: torch.Tensor, up: torch.Tensor, scale: float):
    """A forward hook adding the low-rank delta `scale * B @ A` (down = A, up = B) to a module's output."""
    return lambda module, inputs, output: output + scale * (inputs[0] @ down.T) @ up.T


class LoRA:
    """Low-rank deltas `scale * B @ A` added to target modules' outputs while `enabled()` is active."""

    def __init__(self, model: torch.nn.Module, adapter_dir: str | Path) -> None:
        adapter_dir = Path(adapter_dir)
        config_file, weights_file = adapter_dir / "adapter_config.json", adapter_dir / "adapter_model.safetensors"
        if not (config_file.is_file() and weights_file.is_file()):
            raise ConfigError(f"draft_adapter must be a PEFT adapter directory, got {str(adapter_dir)!r}")
        config = json.loads(config_file.read_text(encoding="utf-8"))
        self.scale = config["lora_alpha"] / config["r"]
        weights = load_file(weights_file)
        modules = dict(model.named_modules())
        param = next(model.parameters())
        self.deltas: list[tuple[torch.nn.Module, torch.Tensor, torch.Tensor]] = []
        for key in sorted(k for k in weights if k.endswith("lora_A.weight")):
            name = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            if name not in modules:
                raise ConfigError(f"draft_adapter targets {name!r}, which the model does not have")
            down = weights[key].to(param)
            up = weights[key.replace("lora_A", "lora_B")].to(param)
            self.deltas.append((modules[name], down, up))

    @contextmanager
    def enabled(self) -> Iterator[None]:
        handles = [module.register_forward_hook(delta_hook(down, up, self.scale)) for module, down, up in self.deltas]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
