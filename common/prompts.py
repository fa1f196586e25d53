"""Prompts files: one text prompt per line, or JSONL (`.jsonl`) whose lines are `{"prompt": TEXT}` or chat
`{"messages": [...]}` rendered with the checkpoint's chat template (a chat prompt spans several lines of text)."""

import json
from pathlib import Path
from typing import Any

from parallel_decoding.common.errors import ConfigError

Prompt = str | list[dict[str, str]]


def read_prompts(path: str) -> list[Prompt]:
    """The prompts of a file: text lines, or a `.jsonl` file's prompts and chats; an empty line is refused rather
    than decoded from nothing."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise ConfigError(f"--prompts-file cannot be read: {err}") from None
    empty = [i + 1 for i, line in enumerate(lines) if not line.strip()]
    if not lines or empty:
        raise ConfigError(f"--prompts-file must hold one non-empty prompt per line; empty line(s): {empty or [1]}")
    return [parse_line(line, i + 1) for i, line in enumerate(lines)] if str(path).endswith(".jsonl") else lines


def parse_line(line: str, number: int) -> Prompt:
    """One JSONL line's prompt: its `prompt` text or its `messages`."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ConfigError(f"--prompts-file line {number} is not JSON: {err}") from None
    if isinstance(record, dict) and isinstance(record.get("prompt"), str):
        return record["prompt"]
    messages = record.get("messages") if isinstance(record, dict) else None
    if not (isinstance(messages, list) and messages
            and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages)):
        raise ConfigError(f'--prompts-file line {number} must be {{"prompt": TEXT}} or {{"messages": [{{"role": ..., '
                          f'"content": TEXT}}, ...]}}, got {line[:80]!r}')
    return messages


def encode(tokenizer: Any, prompt: Prompt) -> list[int]:
    """Token ids of a text prompt, or of chat messages rendered with the tokenizer's chat template and the
    assistant's turn opened."""
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError("chat prompts (messages) need a checkpoint with a chat template; this tokenizer has none")
    ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def text_only(prompts: list[Prompt], method: str) -> list[str]:
    """The prompts of a method that takes text alone; chat messages refused by name."""
    if any(not isinstance(p, str) for p in prompts):
        raise ConfigError(f"--method {method} takes text prompts; chat messages (JSONL `messages`) are not applied")
    return prompts  # type: ignore[return-value]
