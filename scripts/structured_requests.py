"""Structured-output requests on a chat checkpoint (20 JSON schemas and 20 regexes over chat prompts), xgrammar
matchers for them, and the reference runner's output for one under its constraint: what the structured-output tests
and `python -m scripts.evaluate --suite structured` share."""

import json
from pathlib import Path

import torch
import xgrammar as xgr
from transformers import AutoTokenizer

from parallel_decoding.common import margins as slack
from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.grammar import Matcher
from parallel_decoding.common.methods import make_decoder
from parallel_decoding.common.runner import ReferenceRunner, Result
from parallel_decoding.common.sampling import SamplingParams

FIELDS = [("name", {"type": "string"}), ("age", {"type": "integer"}), ("city", {"type": "string"}),
          ("score", {"type": "number"}), ("active", {"type": "boolean"}),
          ("color", {"enum": ["red", "green", "blue"]}), ("tags", {"type": "array", "items": {"type": "string"},
                                                                  "maxItems": 3}),
          ("year", {"type": "integer", "minimum": 1900, "maximum": 2100})]


def schema(i: int) -> dict:
    """The i-th JSON schema: two or three of `FIELDS`, all required."""
    fields = [FIELDS[(i + j) % len(FIELDS)] for j in range(2 + i % 2)]
    return {"type": "object", "properties": dict(fields), "required": [name for name, _ in fields]}


SCHEMAS = [schema(i) for i in range(20)]
REGEXES = [r"\(\d{3}\) \d{3}-\d{4}", r"\d{4}-\d{2}-\d{2}", r"([01]\d|2[0-3]):[0-5]\d", r"#[0-9a-f]{6}",
           r"(\d{1,3}\.){3}\d{1,3}", r"\d{5}", r"(yes|no)", r"-?\d+", r"\d+\.\d{2}", r"[A-Z][a-z]+( [A-Z][a-z]+)?",
           r"[a-z]{3,8}@[a-z]{3,8}\.com", r"v\d+\.\d+\.\d+", r"(Monday|Tuesday|Wednesday|Thursday|Friday)",
           r"[A-Z]{3}-\d{3}", r"\$\d{1,4}", r"(true|false)", r"\d{1,2}/\d{1,2}/\d{4}", r"[a-z]+(_[a-z]+){1,2}",
           r"(low|medium|high)", r"[A-Z]{2}\d{2} [A-Z]{3}"]
TOPICS = ["a famous painter", "a small town", "a video game", "a chemistry teacher", "a football club",
          "an old castle", "a jazz musician", "a bakery", "a river", "a software library"]
JSON_TOKENS, REGEX_TOKENS = 40, 20


def requests(model_dir: str | Path) -> list[tuple[list[int], dict, int]]:
    """(prompt ids, the constraint as {"json": schema} or {"regex": pattern}, max tokens) per request."""
    from scripts import chat_prompts

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    out = []
    for i, spec in enumerate(SCHEMAS):
        fields = ", ".join(spec["properties"])
        text = f"Describe {TOPICS[i % len(TOPICS)]} as a JSON object with the fields {fields}."
        out.append((chat_prompts.render(tokenizer, text), {"json": spec}, JSON_TOKENS))
    for i, regex in enumerate(REGEXES):
        text = f"Give one example value matching /{regex}/ for {TOPICS[i % len(TOPICS)]}."
        out.append((chat_prompts.render(tokenizer, text), {"regex": regex}, REGEX_TOKENS))
    return out


class Grammars:
    """xgrammar matchers for the requests' constraints on the real model's vocabulary."""

    def __init__(self, model_dir: str | Path, vocab_size: int) -> None:
        info = xgr.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(model_dir), vocab_size=vocab_size)
        self.compiler = xgr.GrammarCompiler(info)
        self.vocab_size = vocab_size

    def matcher(self, constraint: dict) -> xgr.GrammarMatcher:
        if "json" in constraint:
            return xgr.GrammarMatcher(self.compiler.compile_json_schema(json.dumps(constraint["json"])))
        return xgr.GrammarMatcher(self.compiler.compile_regex(constraint["regex"]))

    def walk(self, constraint: dict, tokens: list[int], logits: torch.Tensor | None = None) -> tuple[bool, bool,
                                                                                                     list[float]]:
        """Whether every token is accepted, whether the grammar ended there, and (with the teacher-forced `logits`)
        each position's top-2 margin among the tokens the grammar allows there."""
        matcher, bitmask, margins = self.matcher(constraint), xgr.allocate_token_bitmask(1, self.vocab_size), []
        for i, token in enumerate(tokens):
            if logits is not None:
                matcher.fill_next_token_bitmask(bitmask)
                row = logits[i : i + 1].clone()
                xgr.apply_token_bitmask_inplace(row, bitmask)
                margins.append(slack.top2(row))
            if not matcher.accept_token(token):
                return False, False, margins
        return True, matcher.is_terminated(), margins


def decode(runner: ReferenceRunner, grammars: "Grammars", method: str, config: object, prompt: list[int],
           constraint: dict | None, max_tokens: int, eos: tuple[int, ...]) -> Result:
    """The reference runner's greedy output for one request, under `constraint` (None: unconstrained)."""
    decoder = make_decoder(method, config, prompt, SamplingParams(), Limits(max_tokens, eos_token_ids=eos))
    if constraint is not None:
        decoder.grammar = Matcher(grammars.matcher(constraint))
    return runner.run(decoder)
