"""The structured-output tests' checks: xgrammar's own matcher walked along an output (every token accepted, the
grammar ended where the request stopped) and the top-2 margins of the grammar-masked distribution, for
`ties.compare`; and the reference runner's outputs under the same constraints, which a committing method's engine
path must equal. The requests themselves are `scripts.structured_requests`'."""

from pathlib import Path

import torch

from parallel_decoding.common.checkpoint import eos_token_ids, load
from parallel_decoding.common.methods import parse_config
from parallel_decoding.common.runner import ReferenceRunner
from scripts.structured_requests import Grammars, decode, requests
from tests.support import ties

__all__ = ["Grammars", "check", "decode", "reference", "requests"]


def reference(model_dir: str | Path, spec: dict, requests: list) -> tuple[list[list[int]], list[list[float]]]:
    """Tokens and decision margins of the reference runner (float32) for `requests` under their constraints, with
    an engine's speculative config `spec` (its method and settings)."""
    model, tokenizer = load(model_dir, dtype=torch.float32)
    mask = model.config.mask_token_id
    settings = {k: v for k, v in spec.items() if k not in ("method", "adaptive")}
    config = parse_config(spec["method"], settings, mask_token_id=mask if mask is not None else tokenizer.mask_token_id)
    runner, grammars = ReferenceRunner(model), Grammars(model_dir, model.config.vocab_size)
    eos = eos_token_ids(model, tokenizer)
    results = [decode(runner, grammars, spec["method"], config, p, c, n, eos) for p, c, n in requests]
    return [r.token_ids for r in results], [r.margins for r in results]


def check(model_dir: str | Path, requests: list, got: list[tuple[list[int], bool]], want: list[list[int]],
          label: str, margins: list[list[float]] | None = None) -> list[int | None]:
    """Every output of `got` (tokens, whether it stopped before `max_tokens`) valid under its request's
    constraint, and equal to `want` up to a near-tie: AR's under the same constraint, on the margins of the masked
    distribution along it, or (with their `margins`) the reference runner's for a committing method."""
    model = ties._model(str(model_dir))
    grammars = Grammars(model_dir, model.config.vocab_size)
    found = []
    for (prompt, constraint, _), (tokens, stopped), reference in zip(requests, got, want, strict=True):
        if margins is None:
            with torch.inference_mode():
                logits = model(input_ids=torch.tensor([prompt + reference[:-1]])).logits[0, len(prompt) - 1 :]
            accepted, _, reference_margins = grammars.walk(constraint, reference, logits.float())
            assert accepted, f"AR broke its own constraint: {reference}"
            found.append(reference_margins)
        accepted, ended, _ = grammars.walk(constraint, tokens)
        assert accepted, f"{label}: a token the grammar rejects in {tokens}"
        assert ended or not stopped, f"{label}: stopped before the grammar ended: {tokens}"
    return ties.compare([t for t, _ in got], want, found if margins is None else margins)
