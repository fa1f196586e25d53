"""Huginn's structured-output cases on the trained Raven, shared by the engine tests: a few code requests under a
regex and a JSON schema (CI), or the 40 requests of `scripts.structured_requests` (20 JSON schemas, 20 regexes over
chat prompts; a sweep); with the reference wavefront's tokens under the same constraints, and the check that an
engine's outputs equal them and are valid."""

import json
from pathlib import Path

from transformers import AutoTokenizer

from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.grammar import Matcher
from parallel_decoding.common.huginn.config import HuginnConfig
from parallel_decoding.common.huginn.reference import generate
from parallel_decoding.common.models.raven import RavenConfig, RavenForCausalLM
from scripts.structured_requests import Grammars, requests

TRAINED = Path(__file__).resolve().parents[2] / "scripts" / "trained" / "raven"
SETTINGS = {"sampler": "wavefront", "num_steps": 32, "inner_recurrence": 4}
CODE_TOKENS = 24
CODE_CONSTRAINTS = [{"regex": "[a-z_]+\\(self(, [a-z_]+)*\\)"},
                    {"json": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}]


def cases(which: str) -> list[tuple[list[int], dict, int]]:
    """(prompt ids, constraint, max tokens) per request: `code` (4) or `structured` (40)."""
    if which == "structured":
        return requests(TRAINED)
    tokenizer = AutoTokenizer.from_pretrained(TRAINED)
    ids = [tokenizer.encode(text) for text in ["def __init__(self, name", "    return self._data["]]
    return [(p, c, CODE_TOKENS) for p in ids for c in CODE_CONSTRAINTS]


def reference(work: list[tuple[list[int], dict, int]]) -> list[list[int]]:
    """The reference wavefront's greedy tokens per request under its constraint (stopping at EOS)."""
    model = RavenForCausalLM.from_pretrained(TRAINED)
    grammars, eos = Grammars(TRAINED, model.config.vocab_size), AutoTokenizer.from_pretrained(TRAINED).eos_token_id
    return [generate(model, p, HuginnConfig(**SETTINGS), limits=Limits(n, eos_token_ids=(eos,)),
                     grammar=Matcher(grammars.matcher(c))).token_ids for p, c, n in work]


def check(work: list[tuple[list[int], dict, int]], got: list[list[int]], want: list[list[int]]) -> None:
    """`got` equals the reference's tokens, and each output is valid: every token accepted, and the grammar ended
    (its EOS accepted) unless the request ran to its max tokens."""
    assert got == want
    grammars = Grammars(TRAINED, RavenConfig.from_dict(json.loads((TRAINED / "config.json").read_text())).vocab_size)
    for (_, constraint, max_tokens), tokens in zip(work, got, strict=True):
        accepted, ended, _ = grammars.walk(constraint, tokens)  # ended: its EOS accepted where the grammar ends
        assert accepted and (ended or len(tokens) == max_tokens), (constraint, tokens)
