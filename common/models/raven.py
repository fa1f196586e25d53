"""Huginn's recurrent-depth transformer (`RavenForCausalLM`, seed 000) in plain torch, on the published checkpoint's
config fields and weight names, for the reference runner of the `huginn` samplers.

A prelude embeds the tokens, a core block of a few layers runs r times from a random initial latent with the
embedding injected each time (`adapter(concat[z, e])`), and a coda decodes. The KV cache keeps one slot per layer,
the core's shared by all recurrences (upstream's `compress-s4`): the newest recurrence's write wins, so the cache
costs what an 8-layer model's costs.
"""

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import load_file
from torch import nn

from parallel_decoding.common.errors import ConfigError

MODEL_TYPE = "huginn_raven"
ARCHITECTURE = "RavenForCausalLM"


@dataclass(frozen=True)
class RavenConfig:
    """The fields of Huginn-0125's `config.json` the model uses (others are ignored)."""

    n_embd: int = 5280
    n_heads: int = 55
    block_size: int = 4096
    vocab_size: int = 65536
    intermediate_size: int = 17920
    bias: bool = False
    norm_eps: float = 1e-6
    n_layers_in_prelude: int = 2
    n_layers_in_recurrent_block: int = 4
    n_layers_in_coda: int = 2
    mean_recurrence: int = 32
    mean_backprop_depth: int = 8
    qk_bias: bool = True
    rope_base: float = 50_000.0
    tie_embeddings: bool = True
    test_time_noise: float = 0.0

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "RavenConfig":
        if raw.get("model_type", MODEL_TYPE) != MODEL_TYPE:
            raise ConfigError(f"not a Huginn checkpoint: model_type {raw.get('model_type')!r}, want {MODEL_TYPE!r}")
        if raw.get("test_time_noise", 0):
            raise ConfigError(f"test_time_noise is not supported, got {raw['test_time_noise']}")
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in names})

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_heads

    @property
    def init_std(self) -> float:
        """Standard deviation of the initial latent before the embedding scale (upstream's `init_values['std']`)."""
        return math.sqrt(2 / (5 * self.n_embd))

    @property
    def emb_scale(self) -> float:
        return math.sqrt(self.n_embd)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        n_layers = self.n_layers_in_prelude + self.n_layers_in_recurrent_block + self.n_layers_in_coda
        return {"architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, "n_layers": n_layers, **out}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotate(x: torch.Tensor, positions: torch.Tensor, head_dim: int, base: float) -> torch.Tensor:
    """RoPE on adjacent feature pairs (upstream's complex-like rotation); x is [..., n, heads, head_dim]."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=x.device) / head_dim))
    angles = positions.float()[:, None] * inv[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    pairs = x.float().unflatten(-1, (-1, 2))
    real, imag = pairs[..., 0], pairs[..., 1]
    return torch.stack([real * cos - imag * sin, imag * cos + real * sin], -1).flatten(-2).type_as(x)


LAYOUTS = ("compress-s4", "full")


class Cache(Protocol):
    """Where the model's attention keeps and reads keys and values: `KVCache` here, an engine's paged cache there."""

    def slot(self, layer: int, recurrence: int) -> tuple[int, int]: ...

    def attend(self, slot: tuple[int, int], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor: ...


class KVCache:
    """Keys and values per layer slot, positions 0..length-1. `compress-s4` (upstream's name): one slot per core
    layer shared by all recurrences, the newest write wins (the memory of an 8-layer model); `full`: a slot per
    recurrence, so a position's recurrence t attends to the others' recurrence t, as in a parallel forward."""

    def __init__(self, layout: str = "compress-s4") -> None:
        if layout not in LAYOUTS:
            raise ConfigError(f"cache_lookup_strategy must be one of {LAYOUTS}, got {layout!r}")
        self.layout = layout
        self.keys: dict[tuple[int, int], torch.Tensor] = {}
        self.values: dict[tuple[int, int], torch.Tensor] = {}
        self.length = 0

    def slot(self, layer: int, recurrence: int) -> tuple[int, int]:
        """The slot of `layer` (its index in prelude, core, coda order) at `recurrence` (0 outside the core)."""
        return (layer, recurrence if self.layout == "full" else 0)

    def write(self, slot: tuple[int, int], start: int, keys: torch.Tensor, values: torch.Tensor
              ) -> tuple[torch.Tensor, ...]:
        """Store rows at positions start.. (over whatever was there) and return the slot's keys and values up to
        the last of them; [heads, positions, head_dim]."""
        end = start + keys.shape[1]
        old_k = self.keys.get(slot, keys[:, :0])[:, :start]
        old_v = self.values.get(slot, values[:, :0])[:, :start]
        if old_k.shape[1] != start:
            raise RuntimeError(f"layer slot {slot} holds {old_k.shape[1]} positions, a window starts at {start}")
        self.keys[slot] = torch.cat([old_k, keys], 1)
        self.values[slot] = torch.cat([old_v, values], 1)
        self.length = max(self.length, end)
        return self.keys[slot][:, :end], self.values[slot][:, :end]

    def attend(self, slot: tuple[int, int], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        """Write the rows' keys and values into `slot` and attend causally over the slot's prefix; q, k, v and the
        result are [n, heads, head_dim]."""
        start, n = int(positions[0]), q.shape[0]
        keys, values = self.write(slot, start, k.transpose(0, 1), v.transpose(0, 1))
        mask = torch.ones(n, keys.shape[1], dtype=torch.bool, device=q.device).tril(start)
        y = nn.functional.scaled_dot_product_attention(q.transpose(0, 1), keys, values, attn_mask=mask)
        return y.transpose(0, 1)

    def crop(self, length: int) -> None:
        """Keep the first `length` positions of every slot."""
        for slot in self.keys:
            self.keys[slot] = self.keys[slot][:, :length]
            self.values[slot] = self.values[slot][:, :length]
        self.length = min(self.length, length)


class LayerCache:
    """The model's `Cache` on an engine's attention layers, one per model layer (the core's shared by all
    recurrences, as `compress-s4`), called on flat [n, heads * head_dim] rows with `args` after them."""

    def __init__(self, layers: nn.ModuleList, *args: Any) -> None:
        self.layers, self.args = layers, args

    def slot(self, layer: int, recurrence: int) -> tuple[int, int]:
        return (layer, 0)

    def attend(self, slot: tuple[int, int], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        n = q.shape[0]
        flat = [t.reshape(n, -1).contiguous() for t in (q, k, v)]
        return self.layers[slot[0]](*flat, *self.args).view(q.shape)


class Attention(nn.Module):
    def __init__(self, config: RavenConfig) -> None:
        super().__init__()
        self.config = config
        self.Wqkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)
        if config.qk_bias:
            self.qk_bias = nn.Parameter(torch.zeros(2, 1, config.n_heads, config.head_dim))
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: Cache | None, slot: tuple[int, int]
                ) -> torch.Tensor:
        """x is [n, d] (rows after a cached prefix, attended through `cache`) or, without a cache,
        [batch, n, d] from position 0 (training)."""
        config = self.config
        q, k, v = self.Wqkv(x).unflatten(-1, (3, config.n_heads, config.head_dim)).unbind(-3)
        if config.qk_bias:
            q, k = q + self.qk_bias[0, 0], k + self.qk_bias[1, 0]
        q = rotate(q, positions, config.head_dim, config.rope_base)
        k = rotate(k, positions, config.head_dim, config.rope_base)
        if cache is None:
            y = nn.functional.scaled_dot_product_attention(
                q.transpose(-3, -2), k.transpose(-3, -2), v.transpose(-3, -2), is_causal=True).transpose(-3, -2)
        else:
            y = cache.attend(slot, q, k, v, positions)
        return self.proj(y.flatten(-2))


class GatedMLP(nn.Module):
    def __init__(self, config: RavenConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 2 * config.intermediate_size, bias=False)
        self.proj = nn.Linear(config.intermediate_size, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.fc(x).chunk(2, dim=-1)
        return self.proj(nn.functional.silu(gate) * up)


class SandwichBlock(nn.Module):
    def __init__(self, config: RavenConfig) -> None:
        super().__init__()
        self.norm_1 = RMSNorm(config.n_embd, config.norm_eps)
        self.attn = Attention(config)
        self.norm_2 = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = GatedMLP(config)
        self.norm_3 = RMSNorm(config.n_embd, config.norm_eps)
        self.norm_4 = RMSNorm(config.n_embd, config.norm_eps)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: Cache | None, slot: tuple[int, int]
                ) -> torch.Tensor:
        x = self.norm_2(self.attn(self.norm_1(x), positions, cache, slot) + x)
        return self.norm_4(self.mlp(self.norm_3(x)) + x)


class RavenForCausalLM(nn.Module):
    """Rows are one request's consecutive positions after its cached prefix ([n, d] tensors, no batch axis)."""

    def __init__(self, config: RavenConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(config.vocab_size, config.n_embd),
            "prelude": nn.ModuleList(SandwichBlock(config) for _ in range(config.n_layers_in_prelude)),
            "adapter": nn.Linear(2 * config.n_embd, config.n_embd, bias=config.bias),
            "core_block": nn.ModuleList(SandwichBlock(config) for _ in range(config.n_layers_in_recurrent_block)),
            "coda": nn.ModuleList(SandwichBlock(config) for _ in range(config.n_layers_in_coda)),
            "ln_f": RMSNorm(config.n_embd, config.norm_eps),
        })
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.transformer["wte"].weight

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32) -> "RavenForCausalLM":
        """Load a checkpoint directory: `config.json` and `model.safetensors` (or its sharded index)."""
        path = Path(path)
        config = RavenConfig.from_dict(json.loads((path / "config.json").read_text(encoding="utf-8")))
        index = path / "model.safetensors.index.json"
        files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else [
            "model.safetensors"]
        model = cls(config)
        loaded = model.load_weights(item for name in files for item in load_file(path / name).items())
        missing = {name for name, _ in model.named_parameters()} - loaded
        if missing:
            raise ConfigError(f"the checkpoint lacks {sorted(missing)}")
        return model.to(dtype).eval()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy (name, tensor) pairs in the checkpoint's names into the parameters (the engines' loading interface
        too); return the names loaded."""
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            if name == "freqs_cis" or (name == "lm_head.weight" and self.config.tie_embeddings):
                continue  # upstream saves its RoPE table, which we compute, and may save the tied head
            if name not in params:
                raise ConfigError(f"unexpected weight {name!r} in a RavenForCausalLM checkpoint")
            with torch.no_grad():
                params[name].copy_(tensor)
            loaded.add(name)
        return loaded | ({"lm_head.weight"} if self.config.tie_embeddings else set())

    def save_pretrained(self, path: str | Path) -> None:
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(self.config.to_dict(), indent=1) + "\n")
        state = {k: v.contiguous() for k, v in self.state_dict().items()}
        if self.config.tie_embeddings:
            state.pop("lm_head.weight")
        save_file(state, path / "model.safetensors")

    def initial_latent(self, generator: torch.Generator, scale: float = 1.0) -> torch.Tensor:
        """One position's random initial latent (truncated normal, upstream's `initialize_state`), [d]."""
        std = self.config.init_std * scale
        weight = self.transformer["wte"].weight
        if std <= 0:
            return torch.zeros(self.config.n_embd, dtype=weight.dtype, device=weight.device)
        z = torch.empty(self.config.n_embd)
        nn.init.trunc_normal_(z, mean=0.0, std=std, a=-3 * std, b=3 * std, generator=generator)
        return (z * self.config.emb_scale).to(weight)

    def embed(self, token_ids: torch.Tensor, positions: torch.Tensor, cache: Cache | None) -> torch.Tensor:
        """The prelude's output e for the rows (writes the prelude's KV)."""
        x = self.transformer["wte"](token_ids) * self.config.emb_scale
        for i, block in enumerate(self.transformer["prelude"]):
            x = block(x, positions, cache, _slot(cache, i, 0))
        return x

    def recur(self, z: torch.Tensor, e: torch.Tensor, positions: torch.Tensor, cache: Cache | None,
              recurrence: int) -> torch.Tensor:
        """The rows' `recurrence`-th pass of the core block with input injection (writes the core's KV)."""
        x = self.transformer["adapter"](torch.cat([z, e], -1))
        base = self.config.n_layers_in_prelude
        for i, block in enumerate(self.transformer["core_block"]):
            x = block(x, positions, cache, _slot(cache, base + i, recurrence))
        return x

    def recur_rows(self, z: torch.Tensor, e: torch.Tensor, positions: torch.Tensor, cache: Cache | None,
                   inner: torch.Tensor, first_recurrence: int = 0) -> torch.Tensor:
        """Row i's `inner[i]` recurrences in one loop of max(inner) passes, so requests wanting different depths
        share a batch: a row that is done repeats its last pass on the same input, which writes the same KV and
        gives the same latent (one kernel shape throughout), so extra passes cost time, never results."""
        z_in, out = z, z
        for t in range(int(inner.max()) if inner.numel() else 0):
            out = self.recur(z_in, e, positions, cache, first_recurrence + t)
            z_in = torch.where((t + 1 < inner)[:, None], out, z_in)
        return out

    def hidden(self, z: torch.Tensor, positions: torch.Tensor, cache: Cache | None) -> torch.Tensor:
        """The coda's normalized output for latents z (writes the coda's KV)."""
        x = self.transformer["ln_f"](z)
        base = self.config.n_layers_in_prelude + self.config.n_layers_in_recurrent_block
        for i, block in enumerate(self.transformer["coda"]):
            x = block(x, positions, cache, _slot(cache, base + i, 0))
        return self.transformer["ln_f"](x)

    def decode(self, z: torch.Tensor, positions: torch.Tensor, cache: Cache | None) -> torch.Tensor:
        """Logits from latents through the coda (writes the coda's KV), float32 [..., n, vocab]."""
        return self.lm_head(self.hidden(z, positions, cache)).float()


def _slot(cache: Cache | None, layer: int, recurrence: int) -> tuple[int, int]:
    return (layer, 0) if cache is None else cache.slot(layer, recurrence)
