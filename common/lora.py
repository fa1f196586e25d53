"""A PEFT-format LoRA switched on only inside a context: NLD's draft-only adapter (on `o_proj`), on a transformers
model or an engine's (whose linear layers may return `(output, bias)`), with no second copy of the base weights."""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file

from common.checkpoint import stock_weight_name
from common.errors import ConfigError


def delta_hook(down: torch.Tensor, up: torch.Tensor, scale: float):
    """A forward hook adding the low-rank delta `scale * B @ A` (down = A, up = B) to a module's output (the first
    element where the module returns `(output, bias)`, as the engines' linear layers do)."""

    def hook(module: torch.nn.Module, inputs: tuple, output: object) -> object:
        if isinstance(output, tuple):
            return (output[0] + scale * (inputs[0] @ down.T) @ up.T, *output[1:])
        return output + scale * (inputs[0] @ down.T) @ up.T

    return hook


def adapter_path(model_dir: str | Path, adapter: str | Path) -> Path:
    """The adapter directory `adapter` names (relative to the checkpoint, as NLD's `linear_spec_lora/`), checked to
    be a PEFT adapter."""
    return checked(Path(adapter) if Path(adapter).is_absolute() else Path(model_dir) / adapter)


def checked(path: Path) -> Path:
    if not ((path / "adapter_config.json").is_file() and (path / "adapter_model.safetensors").is_file()):
        raise ConfigError(f"draft_adapter must be a PEFT adapter directory, got {str(path)!r}")
    return path


def module_name(key: str, modules: dict[str, torch.nn.Module]) -> str:
    """The model module a PEFT weight key targets: NLD's own names (`encoder.*`) are the stock model's."""
    name = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
    if name not in modules:
        name = stock_weight_name(name)
    if name not in modules:
        raise ConfigError(f"draft_adapter targets {name!r}, which the model does not have")
    return name


class LoRA:
    """Low-rank deltas `scale * B @ A` added to target modules' outputs while `enabled()` is active."""

    def __init__(self, model: torch.nn.Module, adapter_dir: str | Path) -> None:
        adapter_dir = checked(Path(adapter_dir))
        config = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
        self.scale = config["lora_alpha"] / config["r"]
        weights = load_file(adapter_dir / "adapter_model.safetensors")
        modules = dict(model.named_modules())
        param = next(model.parameters())
        self.deltas: list[tuple[torch.nn.Module, torch.Tensor, torch.Tensor]] = []
        for key in sorted(k for k in weights if k.endswith("lora_A.weight")):
            name = module_name(key, modules)
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
