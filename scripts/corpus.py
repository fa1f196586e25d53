"""The training corpus: this Python's standard-library sources, split by file name into training and held-out files.

A file is held out when the CRC32 of its name is 0 mod 8 (about one in eight); the files the tokenizer is trained on
(`scripts.make_tiny_models.CORPUS_FILES`) are always training files.
"""

import re
import sysconfig
import zlib
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast

from scripts.make_tiny_models import CORPUS_FILES


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(name: str) -> bool:
    return name not in CORPUS_FILES and zlib.crc32(name.encode()) % 8 == 0


def files(held_out: bool, root: Path | None = None) -> list[Path]:
    """The split's `*.py` files under `root` (the standard library by default), sorted by name."""
    return [p for p in sorted((root or stdlib_dir()).glob("*.py")) if is_held_out(p.name) == held_out]


def token_ids(tokenizer: PreTrainedTokenizerFast, paths: list[Path]) -> torch.Tensor:
    """Every file's tokens, each followed by EOS, in order."""
    ids: list[int] = []
    for path in paths:
        ids += tokenizer.encode(path.read_text(encoding="utf-8", errors="ignore")) + [tokenizer.eos_token_id]
    return torch.tensor(ids)


def prompts(count: int, length: int = 160, per_file: int = 2, root: Path | None = None) -> list[str]:
    """Held-out prompts: from each held-out file's first `per_file` lines that open a `def` or `class` (indented or
    not), the next `length` characters cut before a line break (so that the model writes the break and the next
    line's indentation, as one token, the way it was trained); `count` of them in file order."""
    found = []
    for path in files(held_out=True, root=root):
        text = path.read_text(encoding="utf-8", errors="ignore")
        starts = [m.start() + 1 for m in re.finditer(r"\n *(def|class) \w+[(:]", text)][:per_file]
        for start in starts:
            chunk = text[start : start + length]
            cut = chunk.rfind("\n")
            if cut > 0:
                found.append(chunk[:cut])
    return found[:count]
