"""Offline generation with any method on a transformers checkpoint: the oracle for the engine adapters.

    parallel-decoding generate --model DIR \\
        --method {ar,jacobi,diffusion_self,diffusion_self_quadratic,diffusion,wedlm,wedlm_spec,huginn,assd} \\
        [--config JSON] [--max-tokens N] [--temperature T] [--top-p P] [--seed S] \\
        --prompts-file FILE --json OUT

A prompts file holds one text prompt per line, or (`.jsonl`) one `{"prompt": TEXT}` or chat `{"messages": [...]}`
per line, rendered with the checkpoint's chat template (`python -m scripts.chat_prompts FILE.jsonl` writes some).

`huginn` runs a recurrent-depth (`RavenForCausalLM`) checkpoint with `common.huginn`'s samplers (`--config
'{"sampler": "wavefront"}'`); its records add `core_passes` (sequential core-block passes, the latency cost).
`assd` fills the holes of each prompt (the tokenizer's mask token in the text, one token per hole; or a line
`{"prompt": TEXT, "holes": [token positions]}`; plus `--max-tokens` holes after it to continue it) with an
any-subset AR model (XLNet) by any-subset speculative decoding (`common.assd.decoding`, `--config '{"k": 5, "drafter":
"ngram"}'`); its records add `nfe` (model calls), `draft_calls` (n-gram drafts) and `generated` (holes filled), and
`text` is the whole filled prompt. `parallel-decoding assd-server` serves the same over HTTP.
"""

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.errors import ConfigError
from parallel_decoding.common.methods import METHODS, parse_config
from parallel_decoding.common.prompts import encode, read_prompts, text_only
from parallel_decoding.common.reference_setup import reference_setup
from parallel_decoding.common.sampling import SamplingParams


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="parallel-decoding generate", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="checkpoint directory")
    parser.add_argument("--method", required=True, choices=sorted(METHODS))
    parser.add_argument("--config", default=None, help="method settings as a JSON object")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="default 64; for assd, holes appended to each prompt (default none)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--prompts-file", required=True,
                        help='one prompt per line, or .jsonl lines {"prompt": TEXT} / {"messages": [...]} (chat)')
    parser.add_argument("--json", required=True, help="where to write the per-prompt results")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--no-cache", action="store_true", help="recompute the prefix every forward")
    parser.add_argument("--trust-remote-code", action="store_true", help="use the checkpoint's own modeling code")
    return parser.parse_args(argv)


def json_margins(margins: list[float]) -> list[float | None]:
    """Decision slacks as the JSON records hold them: null where no greedy decision was taken (inf)."""
    return [m if math.isfinite(m) else None for m in margins]


def huginn_records(args: argparse.Namespace, config: Any, sampling: SamplingParams, limits: Limits,
                   prompts: list[str]) -> list[dict]:
    """Per-prompt records of a `huginn` sampler on a recurrent-depth checkpoint."""
    from transformers import PreTrainedTokenizerFast

    from parallel_decoding.common.huginn.reference import generate
    from parallel_decoding.common.models.raven import RavenForCausalLM

    model = RavenForCausalLM.from_pretrained(args.model).to(args.device)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(args.model)
    limits = dataclasses.replace(limits, eos_token_ids=tuple(
        t for t in (tokenizer.eos_token_id,) if t is not None))
    records = []
    for prompt in prompts:
        start = time.perf_counter()
        result = generate(model, tokenizer.encode(prompt), config, sampling, limits)
        records.append({"prompt": prompt, "token_ids": result.token_ids, "text": tokenizer.decode(result.token_ids),
                        "forwards": result.forwards, "core_passes": result.core_passes,
                        "tokens_per_forward": len(result.token_ids) / max(result.forwards, 1), "p_cache": None,
                        "seconds": time.perf_counter() - start, "margins": json_margins(result.margins)})
    return records


def assd_records(args: argparse.Namespace, config: Any, sampling: SamplingParams, prompts: list[str]) -> list[dict]:
    """Per-prompt records of ASSD infilling with an XLNet-style checkpoint."""
    from transformers import PreTrainedTokenizerFast, XLNetLMHeadModel

    from parallel_decoding.common.assd.decoding import infill, with_holes

    model = XLNetLMHeadModel.from_pretrained(args.model, dtype=torch.float32).to(args.device).eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(args.model)
    mask_id = getattr(model.config, "mask_token_id", None) or tokenizer.mask_token_id
    if mask_id is None:
        sys.exit("error: mask_token_id is required: the checkpoint's config and tokenizer name none")
    records = []
    for prompt in prompts:
        if prompt.lstrip().startswith("{"):
            try:
                spec = json.loads(prompt)
                prompt, holes = spec["prompt"], spec.get("holes", [])
                ids = with_holes(tokenizer.encode(prompt), holes, mask_id)
            except (json.JSONDecodeError, KeyError, TypeError, ConfigError) as err:
                sys.exit(f"error: prompt line {prompt!r}: {err} (expected {{\"prompt\": TEXT, \"holes\": "
                         f"[token positions]}})")
        else:
            ids = tokenizer.encode(prompt)
        ids += [mask_id] * (args.max_tokens or 0)
        if mask_id not in ids:
            sys.exit(f"error: prompt {prompt!r} has no hole ({tokenizer.convert_ids_to_tokens(mask_id)}) and "
                     f"--max-tokens appends none")
        start = time.perf_counter()
        result = infill(model, ids, mask_id, config, sampling)
        records.append({"prompt": prompt, "token_ids": result.token_ids, "text": tokenizer.decode(result.token_ids),
                        "nfe": result.nfe, "draft_calls": result.draft_calls, "generated": result.generated,
                        "forwards": result.nfe,
                        "tokens_per_forward": result.tokens_per_call, "p_cache": None,
                        "seconds": time.perf_counter() - start, "margins": []})
    return records


def model_free(args: argparse.Namespace) -> None:
    """`huginn` and `assd`: their own models and runners, not the transformers reference runner."""
    refused = [flag for flag, given in (("--no-cache", args.no_cache), ("--trust-remote-code", args.trust_remote_code))
               if given]
    try:
        if refused:
            raise ConfigError(f"{', '.join(refused)} does not apply to --method {args.method}")
        config = parse_config(args.method, args.config)
        sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
        prompts = text_only(read_prompts(args.prompts_file), args.method)
    except ConfigError as err:
        sys.exit(f"error: {err}")
    if args.method == "huginn":
        limits = Limits(max_tokens=64 if args.max_tokens is None else args.max_tokens)
        records = huginn_records(args, config, sampling, limits, prompts)
        passes = sum(r["core_passes"] for r in records) / max(sum(len(r["token_ids"]) for r in records), 1)
        summary = f"{passes:.2f} sequential core passes per token"
    else:
        records = assd_records(args, config, sampling, prompts)
        summary = f"{sum(r['generated'] for r in records)} holes filled in {sum(r['nfe'] for r in records)} model calls"
    Path(args.json).write_text(json.dumps(records, indent=1), encoding="utf-8")
    print(f"{args.method}: {len(records)} prompts, {summary}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if METHODS[args.method].kind != "step":
        model_free(args)
        return
    try:
        sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
        prompts = read_prompts(args.prompts_file)
        setup = reference_setup(args.model, args.method, args.config, device=args.device,
                                trust_remote_code=args.trust_remote_code, use_cache=not args.no_cache)
        limits = setup.limits(64 if args.max_tokens is None else args.max_tokens)
        encoded = [encode(setup.tokenizer, prompt) for prompt in prompts]
    except ConfigError as err:
        sys.exit(f"error: {err}")
    records = []
    tokenizer = setup.tokenizer
    for prompt, ids in zip(prompts, encoded, strict=True):
        result = setup.runner.run(setup.decoder(ids, sampling, limits))
        records.append({
            "prompt": prompt,
            "token_ids": result.token_ids,
            "text": tokenizer.decode(result.token_ids),
            "forwards": result.forwards,
            "tokens_per_forward": result.tokens_per_forward,
            "p_cache": result.p_cache,
            "seconds": result.seconds,
            "margins": json_margins(result.margins),
        })
    Path(args.json).write_text(json.dumps(records, indent=1), encoding="utf-8")
    total = sum(len(r["token_ids"]) for r in records)
    forwards = sum(r["forwards"] for r in records)
    print(f"{args.method}: {len(records)} prompts, {total} tokens, {total / max(forwards, 1):.2f} tokens/forward")


if __name__ == "__main__":
    main()
