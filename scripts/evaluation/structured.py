"""The cost of structured output: each method in the reference runner on the real model (SmolLM2-135M-Instruct,
float32, its draft adapter) over the 40 requests of `scripts.structured_requests`, with and without their
constraints: valid outputs, tokens per forward and tokens/s, and for the lossless methods how many equal AR's. On a
Raven checkpoint (`--model` a recurrent-depth model), Huginn's `ar` and `wavefront` samplers instead (the
`common.huginn` reference), with their sequential core passes per token."""

import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm
from transformers import AutoTokenizer

from parallel_decoding.common.checkpoint import eos_token_ids, load
from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.diffusion_self import DRAFT_ADAPTER
from parallel_decoding.common.grammar import Matcher
from parallel_decoding.common.huginn.config import HuginnConfig
from parallel_decoding.common.huginn.reference import generate
from parallel_decoding.common.lora import LoRA
from parallel_decoding.common.methods import parse_config
from parallel_decoding.common.models.raven import MODEL_TYPE, RavenForCausalLM
from parallel_decoding.common.runner import ReferenceRunner
from scripts import smollm2
from scripts.structured_requests import Grammars, decode, requests

METHODS = {
    "ar": ("ar", {}),
    "jacobi": ("jacobi", {"block_size": 8, "pool_size": 4}),
    "diffusion_self": ("diffusion_self", {"num_speculative_tokens": 8, "draft_adapter": smollm2.ADAPTER_DIR}),
    "diffusion_self_quadratic": ("diffusion_self", {"mode": "quadratic", "num_speculative_tokens": 3,
                                                    "draft_adapter": smollm2.ADAPTER_DIR}),
    "wedlm_spec": ("wedlm_spec", {"window": 4}),
    "wedlm": ("wedlm", {"window": 8}),
    "diffusion": ("diffusion", {"block_size": 8}),
}
LOSSLESS = ("jacobi", "diffusion_self", "diffusion_self_quadratic", "wedlm_spec")
# On a Raven checkpoint: Huginn's samplers at the trained Raven's r (the wavefront lossy, so none equals `ar` by rule).
HUGINN = {"huginn ar": HuginnConfig(num_steps=32),
          "huginn wavefront": HuginnConfig(sampler="wavefront", num_steps=32, inner_recurrence=4)}


def complete(grammars: Grammars, constraint: dict, tokens: list[int], max_tokens: int) -> bool:
    """Whether `tokens` is valid under `constraint`: accepted throughout, and ended unless cut at `max_tokens`."""
    accepted, ended, _ = grammars.walk(constraint, tokens)
    return accepted and (ended or len(tokens) == max_tokens)


def run(model: str | None = None, prompts: int = 40, device: str = "cpu") -> list[dict[str, Any]]:
    """Per method and setting (constrained or free) over `prompts` requests (half JSON schemas, half regexes):
    valid outputs, tokens per forward, tokens/s and (lossless) outputs equal to AR's in the same setting; printed as
    a table."""
    path = smollm2.ensure() if model is None else Path(model)
    if json.loads((path / "config.json").read_text()).get("model_type") == MODEL_TYPE:
        return huginn(path, prompts)
    loaded, tokenizer = load(path, device=device)
    runner = ReferenceRunner(loaded, adapters={DRAFT_ADAPTER: LoRA(loaded, path / smollm2.ADAPTER_DIR).enabled})
    grammars, eos = Grammars(path, loaded.config.vocab_size), eos_token_ids(loaded, tokenizer)
    work = chosen(requests(path), prompts)
    outputs: dict[tuple[str, bool], list[list[int]]] = {}
    rows = []
    for name, (method, settings) in tqdm(METHODS.items(), desc="methods"):
        config = parse_config(method, settings, mask_token_id=loaded.config.mask_token_id,
                              **({"dlm_type": "dream"} if method != "ar" else {}))
        for constrained in (True, False):
            row, outputs[name, constrained] = measure(name, constrained, work, grammars, functools.partial(
                decode, runner, grammars, method, config, eos=eos))
            row["equal_to_ar"] = sum(a == b for a, b in zip(outputs[name, constrained], outputs["ar", constrained],
                                                            strict=True)) if name in LOSSLESS else None
            rows.append(row)
    return table(rows)


def huginn(path: Path, prompts: int) -> list[dict[str, Any]]:
    """Huginn's samplers (CPU, float32) over the requests, with and without their constraints: valid outputs,
    tokens per forward, sequential core passes per token and tokens/s."""
    model = RavenForCausalLM.from_pretrained(path)
    grammars = Grammars(path, model.config.vocab_size)
    eos = (AutoTokenizer.from_pretrained(path).eos_token_id,)
    work = chosen(requests(path), prompts)
    rows = []
    for name, config in tqdm(HUGINN.items(), desc="samplers"):
        for constrained in (True, False):
            row, _ = measure(name, constrained, work, grammars, lambda p, c, n, config=config: generate(
                model, p, config, limits=Limits(n, eos_token_ids=eos), grammar=c and Matcher(grammars.matcher(c))))
            rows.append(row)
    return table(rows)


def chosen(work: list, prompts: int) -> list:
    """`prompts` of the 40 requests, half from the JSON schemas, half from the regexes."""
    return work[: prompts // 2] + work[20 : 20 + prompts - prompts // 2]


def measure(name: str, constrained: bool, work: list, grammars: Grammars,
            decode_one: Callable[[list[int], dict | None, int], Any]) -> tuple[dict[str, Any], list[list[int]]]:
    """One method and setting over `work`: its row (valid outputs, tokens per forward, tokens/s, and core passes
    per token where the results count them) and its outputs."""
    start = time.perf_counter()
    results = [decode_one(prompt, constraint if constrained else None, max_tokens)
               for prompt, constraint, max_tokens in work]
    seconds = time.perf_counter() - start
    tokens = [r.token_ids for r in results]
    generated = sum(map(len, tokens))
    row = {"method": name, "constrained": constrained, "requests": len(work),
           "valid": sum(complete(grammars, c, t, n) for (_, c, n), t in zip(work, tokens, strict=True)),
           "tokens_per_forward": round(generated / sum(r.forwards for r in results), 3),
           "tokens_per_s": round(generated / seconds, 1), "equal_to_ar": None}
    if hasattr(results[0], "core_passes"):
        row["core_passes_per_token"] = round(sum(r.core_passes for r in results) / generated, 2)
    return row, tokens


def table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Print `rows` as a table; return them."""
    print(f"{'method':<26} {'grammar':>7} {'valid':>6} {'tok/fwd':>8} {'tok/s':>7} {'= AR':>5} {'passes/tok':>10}")
    for row in rows:
        same = "" if row["equal_to_ar"] is None else f"{row['equal_to_ar']}/{row['requests']}"
        print(f"{row['method']:<26} {'yes' if row['constrained'] else 'no':>7} {row['valid']:>3}/{row['requests']} "
              f"{row['tokens_per_forward']:>8.2f} {row['tokens_per_s']:>7.1f} {same:>5} "
              f"{row.get('core_passes_per_token', ''):>10}")
    return rows
