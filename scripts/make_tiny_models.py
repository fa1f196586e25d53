"""Small random HF checkpoints (Qwen3, Qwen2, Llama, Mistral, Ministral3) with a byte-level BPE tokenizer and a mask
token, plus copies dressed as WeDLM and Nemotron-Labs-Diffusion checkpoints ship, a Huginn-style `raven/`
(`RavenForCausalLM`, the published config's field names) and an XLNet `xlnet/` (ASSD's any-subset AR model).

Deterministic (fixed seeds, tokenizer trained on a fixed list of standard-library sources) and offline.
Weights use a wide init (std 0.3) so the top two logits sit far apart and greedy comparisons across
kernels do not flip on rounding.

    python scripts/make_tiny_models.py OUTDIR
"""

import argparse
import json
import shutil
import sysconfig
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Ministral3Config,
    Ministral3ForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    XLNetConfig,
    XLNetLMHeadModel,
)

from parallel_decoding.common.models.raven import RavenConfig, RavenForCausalLM

FAMILIES = {
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "llama": (LlamaConfig, LlamaForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "ministral3": (Ministral3Config, Ministral3ForCausalLM),
}
# NLD's RoPE (YaRN factor 16, llama-4 query scaling) with the original context cut to 32 positions, so that the
# scaling, 1 + 0.1 log(1 + floor(pos / 32)), already changes the queries of short test sequences.
NLD_ROPE = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0, "original_max_position_embeddings": 32,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}
FAMILY_FIELDS = {"ministral3": {"rope_parameters": NLD_ROPE, "max_position_embeddings": 512}}
SPECIAL_TOKENS = ["<|endoftext|>", "<|mask|>"]
# A plain chat format, so that the servers' chat endpoints run on tiny models.
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")
CORPUS_FILES = ["textwrap.py", "string.py", "heapq.py", "bisect.py", "fnmatch.py", "shlex.py", "calendar.py"]
INIT_STD = 0.3


def train_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on standard-library sources present on every Python install."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [(stdlib / name).read_text(encoding="utf-8") for name in CORPUS_FILES]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", mask_token="<|mask|>", pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )


def build_model(family: str, vocab_size: int, mask_token_id: int, eos_token_id: int, seed: int = 0,
                hidden_size: int = 64, num_layers: int = 2) -> torch.nn.Module:
    """A random causal LM of `family` with wide-init weights and `mask_token_id` in its config."""
    config_cls, model_cls = FAMILIES[family]
    config = config_cls(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        tie_word_embeddings=False,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        pad_token_id=eos_token_id,
        **FAMILY_FIELDS.get(family, {"max_position_embeddings": 2048}),
    )
    config.mask_token_id = mask_token_id
    torch.manual_seed(seed)
    model = model_cls(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                param.normal_(0.0, INIT_STD)
            elif "norm" not in name:
                param.zero_()
    return model.eval()


def build_cyclic_model(vocab_size: int = 64, cycle_length: int = 7, seed: int = 0,
                       hidden_size: int = 128) -> torch.nn.Module:
    """A Qwen3 whose greedy output walks cycles of `cycle_length` tokens (token t is followed by `t + 1` within its
    cycle), whatever came before: rejection recycling's test case, where a pool of past continuations fast-forwards.

    Its embeddings are large next to what the random layers add to the residual stream, and its output row for
    token v is the embedding of v's predecessor, so the last token alone picks the next one by a wide margin.
    """
    model = build_model("qwen3", vocab_size, vocab_size - 1, eos_token_id=None, seed=seed, hidden_size=hidden_size)
    generator = torch.Generator().manual_seed(seed)
    embeddings = torch.randn(vocab_size, hidden_size, generator=generator)
    predecessor = [t - 1 if t % cycle_length else min(t + cycle_length, vocab_size) - 1 for t in range(vocab_size)]
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.1)
            layer.mlp.down_proj.weight.mul_(0.1)
        model.model.embed_tokens.weight.copy_(10 * embeddings)
        model.lm_head.weight.copy_(embeddings[predecessor] / hidden_size**0.5)
    return model


def build_raven(vocab_size: int, seed: int = 0, hidden_size: int = 64, mean_recurrence: int = 8
                ) -> RavenForCausalLM:
    """A random Huginn-style recurrent-depth model (prelude 1, core 2, coda 1 layers), upstream's init."""
    config = RavenConfig(n_embd=hidden_size, n_heads=4, block_size=2048, vocab_size=vocab_size,
                         intermediate_size=2 * hidden_size, n_layers_in_prelude=1, n_layers_in_recurrent_block=2,
                         n_layers_in_coda=1, mean_recurrence=mean_recurrence)
    torch.manual_seed(seed)
    model = RavenForCausalLM(config)
    std = config.init_std
    depth = config.n_layers_in_prelude + config.n_layers_in_coda + config.n_layers_in_recurrent_block * mean_recurrence
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() < 2:
                continue
            scale = std / (2 * depth) ** 0.5 if name.endswith("proj.weight") else std
            torch.nn.init.trunc_normal_(param, std=scale, a=-3 * scale, b=3 * scale)
    return model.eval()


def build_xlnet(vocab_size: int, mask_token_id: int, seed: int = 0, d_model: int = 64, n_layer: int = 2,
                init_std: float = INIT_STD) -> XLNetLMHeadModel:
    """A random XLNet LM (two-stream attention), the any-subset AR model ASSD runs on, wide init by default."""
    config = XLNetConfig(vocab_size=vocab_size, d_model=d_model, n_layer=n_layer, n_head=4, d_inner=2 * d_model,
                         pad_token_id=mask_token_id)
    config.mask_token_id = mask_token_id
    torch.manual_seed(seed)
    model = XLNetLMHeadModel(config)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.normal_(0.0, init_std)
    return model.eval()


def as_wedlm(source: Path, target: Path) -> Path:
    """A Qwen3 checkpoint (copied, or in place) dressed as WeDLM-8B ships: `WeDLMForCausalLM`, auto_map, null mask."""
    source, target = Path(source), Path(target)
    if source.resolve() != target.resolve():
        shutil.copytree(source, target, dirs_exist_ok=True)
    config = json.loads((target / "config.json").read_text())
    config.update(
        architectures=["WeDLMForCausalLM"],
        model_type="wedlm",
        auto_map={
            "AutoConfig": "configuration_wedlm.WeDLMConfig",
            "AutoModelForCausalLM": "modeling_wedlm.WeDLMForCausalLM",
        },
        mask_token_id=None,
    )
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return target


def as_nld(source: Path, target: Path) -> Path:
    """A Ministral3 checkpoint copied and dressed as Nemotron-Labs-Diffusion ships: `NemotronLabsDiffusionModel`,
    model_type `nemotron_labs_diffusion`, auto_map, weights under `encoder.` and `diffusion_head.`, block size 32."""
    source, target = Path(source), Path(target)
    shutil.copytree(source, target, dirs_exist_ok=True)
    config = json.loads((target / "config.json").read_text())
    config.update(
        architectures=["NemotronLabsDiffusionModel"],
        model_type="nemotron_labs_diffusion",
        auto_map={
            "AutoConfig": "configuration_nemotron_labs_diffusion.NemotronLabsDiffusionConfig",
            "AutoModel": "modeling_nemotron_labs_diffusion.NemotronLabsDiffusionModel",
        },
        block_size=32,
        dlm_paradigm="bidirectional",
        dlm_type="llada",
    )
    (target / "config.json").write_text(json.dumps(config, indent=2))
    weights = load_file(target / "model.safetensors")
    renamed = {name.replace("model.", "encoder.", 1).replace("lm_head.", "diffusion_head.", 1): tensor
               for name, tensor in weights.items()}
    save_file(renamed, target / "model.safetensors", metadata={"format": "pt"})
    return target


def make_all(outdir: str | Path, hidden_size: int = 64) -> dict[str, Path]:
    """Write every family's checkpoint under `outdir/<family>`, plus WeDLM- and NLD-style ones; return their paths.

    Engines' CPU attention kernels need a head size of at least 32: `hidden_size` 128 gives that.
    """
    tokenizer = train_tokenizer()
    mask_id = tokenizer.convert_tokens_to_ids("<|mask|>")
    paths = {}
    for i, family in enumerate(FAMILIES):
        path = Path(outdir) / family
        model = build_model(family, len(tokenizer), mask_id, tokenizer.eos_token_id, seed=i, hidden_size=hidden_size)
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths[family] = path
    paths["wedlm"] = as_wedlm(paths["qwen3"], Path(outdir) / "wedlm")
    paths["raven"] = Path(outdir) / "raven"
    build_raven(len(tokenizer), seed=len(FAMILIES), hidden_size=hidden_size).save_pretrained(paths["raven"])
    tokenizer.save_pretrained(paths["raven"])
    paths["xlnet"] = Path(outdir) / "xlnet"
    build_xlnet(len(tokenizer), mask_id, seed=len(FAMILIES) + 1, d_model=hidden_size).save_pretrained(paths["xlnet"])
    tokenizer.save_pretrained(paths["xlnet"])
    paths["nld"] = as_nld(paths["ministral3"], Path(outdir) / "nld")
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir")
    parser.add_argument("--hidden-size", type=int, default=64, help="128 or more for vLLM/SGLang CPU kernels")
    args = parser.parse_args()
    for family, path in make_all(args.outdir, args.hidden_size).items():
        print(f"{family}: {path}")


if __name__ == "__main__":
    main()
