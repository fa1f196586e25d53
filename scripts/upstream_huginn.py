"""Run the authors' reference Huginn samplers on our checkpoint, to check that our `wavefront` sampler matches theirs.

    python -m scripts.upstream_huginn --upstream DIR [--model scripts/trained/raven] [--prompts 39] \\
        [--max-tokens 32] [--kwargs '{...}'] [--ours-kwargs '{...}'] [--json out/upstream-huginn.json]

DIR holds upstream's two files, unmodified; from a clone of seal-rg/recurrent-pretraining:

    git show 59e0b69:recpre/raven_modeling_minimal.py > DIR/raven_modeling_minimal.py
    git show 59e0b69:recpre/raven_config_minimal.py > DIR/raven_config_minimal.py

They are imported from a temporary package holding a copy of them; three small shims (`SHIMS`) adapt them to
transformers 5. Per held-out prompt (scripts/evaluation/huginn.py's), greedy: upstream's `generate_diffusion_style`
(init_scale 0, inner_recurrence 4, num_steps 32, exit_t 0.03, every other keyword at upstream's default, its
cache_lookup_strategy "latest-m4-compress-s4" included; `--kwargs` overrides any), upstream's autoregressive path (HF
generate, num_steps 32, compress-s4 cache) and ours, `common.huginn.reference.generate` with the `wavefront` sampler at
the same settings (`--ours-kwargs` adds HuginnConfig fields, e.g. '{"frozen_token": "prediction"}'). Printed, and
written with every prompt's tokens to --json: how many prompts' first max-tokens tokens agree per pair and their
median common prefix, sequential core passes per token, the two models' logit difference and the shims.
"""

import argparse
import dataclasses
import functools
import hashlib
import importlib
import json
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
from safetensors.torch import load_file
from tqdm import tqdm
from transformers import GenerationConfig, PreTrainedTokenizerFast

from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.huginn.config import HuginnConfig
from parallel_decoding.common.huginn.reference import generate
from parallel_decoding.common.models.raven import RavenForCausalLM
from parallel_decoding.common.sampling import SamplingParams
from scripts import corpus

UPSTREAM_REPO = "seal-rg/recurrent-pretraining"
UPSTREAM_COMMIT = "59e0b69b2d96a59cbbe79c9d5034d89ecb5ab6f6"
UPSTREAM_FILES = ("raven_modeling_minimal.py", "raven_config_minimal.py")
PACKAGE = "upstream_recpre"
NUM_STEPS = 32
WAVEFRONT = {"init_scale": 0.0, "inner_recurrence": 4, "num_steps": NUM_STEPS, "exit_t": 0.03}
LOGIT_CHECK_PROMPTS = 4


def shim_tied_weights(up: ModuleType) -> None:
    """_tied_weights_keys as {target: source}: transformers 5's tie_weights() (upstream's __init__) needs a mapping."""
    up.RavenPreTrainedModel._tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}


def shim_initial_cache_position(up: ModuleType) -> None:
    """Backport GenerationMixin._get_initial_cache_position: transformers 5 removed it, _prep_generate_args calls it."""

    def initial_cache_position(self, seq_length: int, device: torch.device, model_kwargs: dict) -> dict:
        cache = model_kwargs.get("past_key_values")
        start = cache.get_seq_length() if cache is not None else 0
        model_kwargs["cache_position"] = torch.arange(start, seq_length, device=device)
        return model_kwargs

    up.RavenForCausalLM._get_initial_cache_position = initial_cache_position


def shim_prepare_inputs(up: ModuleType) -> None:
    """In HF generate, pass cache_position (transformers 5 stops) and drop the full-length position_ids it now keeps."""
    original = up.RavenForCausalLM.prepare_inputs_for_generation

    @functools.wraps(original)  # keeps upstream's signature, which transformers checks model_kwargs against
    def prepare_inputs_for_generation(self, input_ids, past_key_values=None, *args, cache_position=None, **kwargs):
        if cache_position is None and past_key_values is not None:
            cache_position = torch.arange(past_key_values.get_seq_length(), input_ids.shape[1],
                                          device=input_ids.device)
            kwargs.pop("position_ids", None)
        return original(self, input_ids, past_key_values, *args, cache_position=cache_position, **kwargs)

    up.RavenForCausalLM.prepare_inputs_for_generation = prepare_inputs_for_generation


SHIMS: tuple[Callable[[ModuleType], None], ...] = (shim_tied_weights, shim_initial_cache_position,
                                                   shim_prepare_inputs)


def import_upstream(source: Path, workdir: Path) -> ModuleType:
    """Upstream's modeling module, imported from a copy of `source`'s two files in a package under `workdir`
    (upstream imports its config relatively), with the shims applied."""
    package = workdir / PACKAGE
    package.mkdir()
    (package / "__init__.py").touch()
    for name in UPSTREAM_FILES:
        shutil.copy(source / name, package / name)
    sys.path.insert(0, str(workdir))
    module = importlib.import_module(f"{PACKAGE}.raven_modeling_minimal")
    for shim in SHIMS:
        shim(module)
    return module


def load_upstream(up: ModuleType, model_dir: Path) -> tuple[torch.nn.Module, list[str]]:
    """Upstream's RavenForCausalLM with our checkpoint's weights (same names), float32, and the names it computes
    itself (`freqs_cis`) or ties (`lm_head.weight`) rather than loads."""
    raw = json.loads((model_dir / "config.json").read_text())
    config_module = importlib.import_module(f"{PACKAGE}.raven_config_minimal")
    config = config_module.RavenConfig(**{k: v for k, v in raw.items() if k not in ("architectures", "model_type")})
    model = up.RavenForCausalLM(config)
    result = model.load_state_dict(load_file(model_dir / "model.safetensors"), strict=False)
    if result.unexpected_keys or not set(result.missing_keys) <= {"freqs_cis", "lm_head.weight"}:
        raise RuntimeError(f"checkpoint does not fit upstream's model: {result}")
    if model.lm_head.weight is not model.transformer.wte.weight:
        raise RuntimeError("upstream's lm_head is not tied to its embedding")
    return model.float().eval(), sorted(result.missing_keys)


def logit_check(upstream: torch.nn.Module, ours: RavenForCausalLM, prompts: list[list[int]]) -> dict:
    """Max |logit difference| and argmax agreement of the two models' plain forwards (NUM_STEPS, zero init)."""
    diff, same, total = 0.0, 0, 0
    with torch.inference_mode():
        for ids in prompts:
            theirs = upstream(torch.tensor([ids]), num_steps=NUM_STEPS, init_scale=0.0).logits[0]
            positions = torch.arange(len(ids))
            e = ours.embed(torch.tensor(ids), positions, None)
            z = torch.zeros(len(ids), ours.config.n_embd)
            for t in range(NUM_STEPS):
                z = ours.recur(z, e, positions, None, t)
            mine = ours.decode(z, positions, None)
            diff = max(diff, float((theirs - mine).abs().max()))
            same, total = same + int((theirs.argmax(-1) == mine.argmax(-1)).sum()), total + len(ids)
    return {"prompts": len(prompts), "max_abs_diff": diff, "argmax_agreement": same / total}


def greedy(max_tokens: int, **extra: object) -> GenerationConfig:
    return GenerationConfig(do_sample=False, max_new_tokens=max_tokens, eos_token_id=None, pad_token_id=None, **extra)


def upstream_wavefront(model: torch.nn.Module, ids: list[int], max_tokens: int, kwargs: dict) -> tuple[list[int], int]:
    """Upstream's wavefront tokens (it may freeze a few past max_tokens) and its sequential core passes, the full
    prefill counted as its num_steps recurrences (upstream's summary counts it as one pass)."""
    # max_new_tokens rides as a keyword: _prep_generate_args reads it from model_kwargs (else the config's max_length,
    # None in transformers 5)
    out = model.generate_diffusion_style(torch.tensor([ids]), greedy(max_tokens, return_dict_in_generate=True),
                                         max_new_tokens=max_tokens, **kwargs)
    passes = out.scores["num_core_forward_passes"]
    if kwargs.get("full_prefill", True):
        passes += kwargs.get("num_steps", NUM_STEPS) - 1
    return out.sequences[0, len(ids):].tolist(), passes


def upstream_ar(model: torch.nn.Module, ids: list[int], max_tokens: int) -> list[int]:
    """Upstream's autoregressive tokens through HF generate (its GenerationMixin path), on its compress-s4 cache."""
    out = model.generate(torch.tensor([ids]), greedy(max_tokens, return_dict_in_generate=True), num_steps=NUM_STEPS,
                         init_scale=0.0, cache_lookup_strategy="compress-s4")
    cache = out.past_key_values
    if type(cache).__name__ != "HuginnDynamicCache" or cache.lookup_strategy != "compress-s4":
        raise RuntimeError(f"upstream's AR ran on {cache!r}, not its compress-s4 HuginnDynamicCache")
    tokens = out.sequences[0, len(ids):].tolist()
    if len(tokens) != max_tokens:
        raise RuntimeError(f"upstream's AR gave {len(tokens)} tokens, not {max_tokens}")
    return tokens


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def agreement(rows: list[dict], a: str, b: str, max_tokens: int) -> dict:
    """How many prompts' first max_tokens tokens are equal under samplers a and b, and their median common prefix."""
    pairs = [(row[a][:max_tokens], row[b][:max_tokens]) for row in rows]
    return {"equal": sum(x == y for x, y in pairs),
            "median_common_prefix": statistics.median(common_prefix(x, y) for x, y in pairs)}


def run(upstream: torch.nn.Module, model_dir: Path, prompt_count: int, max_tokens: int, kwargs: dict,
        ours_config: HuginnConfig) -> dict:
    ours = RavenForCausalLM.from_pretrained(model_dir)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    prompts = [tokenizer.encode(p) for p in corpus.prompts(prompt_count)]
    report: dict = {"logit_check": logit_check(upstream, ours, prompts[:LOGIT_CHECK_PROMPTS])}
    rows = []
    for ids in tqdm(prompts, desc="prompts"):
        wave, passes = upstream_wavefront(upstream, ids, max_tokens, kwargs)
        ar = upstream_ar(upstream, ids, max_tokens)
        result = generate(ours, ids, ours_config, SamplingParams(), Limits(max_tokens))
        rows.append({"prompt_ids": ids, "upstream_wavefront": wave, "upstream_ar": ar,
                     "ours_wavefront": result.token_ids, "upstream_passes": passes, "ours_passes": result.core_passes})
    report["summary"] = {
        "prompts": len(rows),
        "ours_vs_upstream_wavefront": agreement(rows, "ours_wavefront", "upstream_wavefront", max_tokens),
        "ours_vs_upstream_ar": agreement(rows, "ours_wavefront", "upstream_ar", max_tokens),
        "upstream_wavefront_vs_upstream_ar": agreement(rows, "upstream_wavefront", "upstream_ar", max_tokens),
        "core_passes_per_token": {  # each sampler's passes over the tokens it returned, prefill as num_steps passes
            "ours_wavefront": sum(r["ours_passes"] for r in rows) / sum(len(r["ours_wavefront"]) for r in rows),
            "upstream_wavefront": sum(r["upstream_passes"] for r in rows) / sum(
                len(r["upstream_wavefront"]) for r in rows),
            "ar": NUM_STEPS},
    }
    report["per_prompt"] = rows
    return report


def file_hashes(source: Path) -> dict[str, str]:
    return {name: hashlib.sha256((source / name).read_bytes()).hexdigest() for name in UPSTREAM_FILES}


def print_report(report: dict) -> None:
    check, summary = report["logit_check"], report["summary"]
    print(f"logit check ({check['prompts']} prompts): max |diff| {check['max_abs_diff']:.3g}, "
          f"argmax agreement {check['argmax_agreement']:.3f}")
    print(f"{'pair':<36} {'equal':>7} {'median prefix':>14}")
    for pair in ("ours_vs_upstream_wavefront", "ours_vs_upstream_ar", "upstream_wavefront_vs_upstream_ar"):
        row = summary[pair]
        equal = f"{row['equal']}/{summary['prompts']}"
        print(f"{pair:<36} {equal:>7} {row['median_common_prefix']:>14}")
    print("core passes per token: " + ", ".join(f"{k} {v:.2f}" for k, v in summary["core_passes_per_token"].items()))
    print("shims:\n" + "\n".join(f"  {shim}" for shim in report["shims"]))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.upstream_huginn", description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, type=Path, help="directory holding " + ", ".join(UPSTREAM_FILES))
    parser.add_argument("--model", default="scripts/trained/raven", type=Path)
    parser.add_argument("--prompts", type=int, default=39)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--kwargs", default="{}", help="JSON keywords for upstream's generate_diffusion_style")
    parser.add_argument("--ours-kwargs", default="{}", help="JSON HuginnConfig fields for ours")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    kwargs = WAVEFRONT | json.loads(args.kwargs)
    ours_config = HuginnConfig(sampler="wavefront", **(WAVEFRONT | json.loads(args.ours_kwargs)))
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as workdir:
        upstream, computed = load_upstream(import_upstream(args.upstream, Path(workdir)), args.model)
        report = {"upstream": {"repo": UPSTREAM_REPO, "commit": UPSTREAM_COMMIT, "sha256": file_hashes(args.upstream)},
                  "model": str(args.model), "max_tokens": args.max_tokens, "upstream_wavefront_kwargs": kwargs,
                  "ours_config": dataclasses.asdict(ours_config), "not_loaded": computed,
                  "shims": [f"{shim.__name__}: {shim.__doc__}" for shim in SHIMS]}
        report |= run(upstream, args.model, args.prompts, args.max_tokens, kwargs, ours_config)
    print_report(report)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        print("wrote", args.json)


if __name__ == "__main__":
    main()
