"""A PEFT-format LoRA switched on only inside a context: NLD's draft-only adapter (on `o_proj`, or on every projection
of an AR model's drafter), on a transformers model or an engine's (whose linear layers may return `(output, bias)`
and fuse q/k/v and gate/up into one module), with no second copy of the base weights."""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file

from parallel_decoding.common.checkpoint import stock_weight_name
from parallel_decoding.common.errors import ConfigError


def delta_hook(down: torch.Tensor, up: torch.Tensor, scale: float, rows: torch.Tensor | None = None):
    """A forward hook adding the low-rank delta `scale * B @ A` (down = A, up = B) to a module's output (the first
    element where the module returns `(output, bias)`, as the engines' linear layers do); with `rows` (indices along
    the token dimension, the one before the features) to those rows only, the others left exactly as they were.
    The product runs in the factors' dtype (`LoRA` keeps them in float32: a CPU's bf16 kernels take several times as
    long for a rank-16 product) and is added in the output's."""

    def add(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        picked = x if rows is None else x[..., rows, :]
        delta = (picked.to(down.dtype) @ down.T) @ up.T
        delta = (delta if scale == 1.0 else delta * scale).to(out.dtype)
        return out + delta if rows is None else out.index_add(-2, rows, delta)

    def hook(module: torch.nn.Module, inputs: tuple, output: object) -> object:
        if isinstance(output, tuple):
            return (add(inputs[0], output[0]), *output[1:])
        return add(inputs[0], output)

    return hook


def adapter_path(model_dir: str | Path, adapter: str | Path) -> Path:
    """The adapter directory `adapter` names (relative to the checkpoint, as NLD's `linear_spec_lora/`), checked to
    be a PEFT adapter."""
    return checked(Path(adapter) if Path(adapter).is_absolute() else Path(model_dir) / adapter)


def draft_adapters(model: torch.nn.Module, model_dir: str | Path, config: object) -> dict:
    """The reference runner's `adapters` for a method's config: its `draft_adapter` (named relative to the checkpoint)
    switched on while drafting, or none."""
    from parallel_decoding.common.diffusion_self import DRAFT_ADAPTER

    adapter = getattr(config, "draft_adapter", None)
    return {DRAFT_ADAPTER: LoRA(model, adapter_path(model_dir, adapter)).enabled} if adapter else {}


def checked(path: Path) -> Path:
    if not ((path / "adapter_config.json").is_file() and (path / "adapter_model.safetensors").is_file()):
        raise ConfigError(f"draft_adapter must be a PEFT adapter directory, got {str(path)!r}")
    return path


# The engines fuse PEFT's separate projections: a target's fused module and the index of its slice of the output.
FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
         "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


def module_name(key: str, modules: dict[str, torch.nn.Module]) -> tuple[str, int | None]:
    """The model module a PEFT weight key targets (NLD's own names, `encoder.*`, are the stock model's) and, where
    the model fuses the target with others (`FUSED`), the index of its output slice; None where it is unfused."""
    name = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
    if name not in modules:
        name = stock_weight_name(name)
    if name in modules:
        return name, None
    parent, _, leaf = name.rpartition(".")
    if leaf in FUSED and f"{parent}.{FUSED[leaf][0]}" in modules:
        return f"{parent}.{FUSED[leaf][0]}", FUSED[leaf][1]
    raise ConfigError(f"draft_adapter targets {name!r}, which the model does not have")


def fused_delta(module: torch.nn.Module, slices: dict[int, tuple[torch.Tensor, torch.Tensor]]
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """One (down, up) pair for a fused module from its targets' pairs: downs stacked, ups placed in their targets'
    output slices (`module.output_sizes`), zero elsewhere."""
    sizes = getattr(module, "output_sizes", None)
    if sizes is None or getattr(module, "tp_size", 1) != 1:
        raise ConfigError("draft_adapter on fused projections (q/k/v, gate/up) needs an unsharded fused module "
                          "(tensor_parallel_size 1)")
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    down = torch.cat([slices[i][0] for i in sorted(slices)])
    up = down.new_zeros(sum(sizes), down.shape[0])
    rank = 0
    for i in sorted(slices):
        part = slices[i][1]
        up[offsets[i] : offsets[i] + sizes[i], rank : rank + part.shape[1]] = part
        rank += part.shape[1]
    return down, up


class LoRA:
    """Low-rank deltas `scale * B @ A` added to target modules' outputs while `enabled()` is active; the factors held
    in float32 on the model's device, the scale folded into B."""

    def __init__(self, model: torch.nn.Module, adapter_dir: str | Path) -> None:
        adapter_dir = checked(Path(adapter_dir))
        config = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
        scale = config["lora_alpha"] / config["r"]
        weights = load_file(adapter_dir / "adapter_model.safetensors")
        modules = dict(model.named_modules())
        param = next(model.parameters())
        self.deltas: list[tuple[torch.nn.Module, torch.Tensor, torch.Tensor]] = []
        fused: dict[str, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
        for key in sorted(k for k in weights if k.endswith("lora_A.weight")):
            name, index = module_name(key, modules)
            down = weights[key].to(param.device, torch.float32)
            up = scale * weights[key.replace("lora_A", "lora_B")].to(param.device, torch.float32)
            if index is None:
                self.deltas.append((modules[name], down, up))
            else:
                fused.setdefault(name, {})[index] = (down, up)
        for name, slices in fused.items():
            self.deltas.append((modules[name], *fused_delta(modules[name], slices)))

    @contextmanager
    def enabled(self, rows: torch.Tensor | None = None) -> Iterator[None]:
        """The adapter on for the forwards inside, on every row or only on `rows` (token indices)."""
        if rows is not None:
            rows = rows.to(self.deltas[0][1].device) if self.deltas else rows
        handles = [module.register_forward_hook(delta_hook(down, up, 1.0, rows))
                   for module, down, up in self.deltas]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
