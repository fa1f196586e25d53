"""Every `python -m` command of ours that the README, docs/ or a docstring shows names a module that exists and
flags that module accepts: each module's `--help` is run once and every flag a documented command passes must be
in it (a renamed flag or module fails here, not in a reader's terminal)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ("common", "scripts", "vllm_plugin", "sglang_plugin")
COMMAND = re.compile(r"python -m ((?:" + "|".join(OURS) + r")(?:\.\w+)+)([^`\n]*)")


def documents() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for package in OURS:
        files += sorted((ROOT / package).rglob("*.py"))
    return [f for f in files if f.is_file()]


def commands() -> dict[str, set[str]]:
    """Per module, the flags its documented commands pass (continuation lines joined)."""
    found: dict[str, set[str]] = {}
    for path in documents():
        text = re.sub(r"\\+\n\s*", " ", path.read_text(encoding="utf-8"))
        for module, rest in COMMAND.findall(text):
            flags = {m for m in re.findall(r"(?<![\w-])--[a-z][\w-]*", rest)}
            found.setdefault(module, set()).update(flags)
    return found


COMMANDS = commands()


def test_the_documents_show_commands():
    assert {"common.generate", "scripts.bench", "scripts.serve_demo"} <= set(COMMANDS)


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_documented_flags_exist(module):
    run = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    accepted = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", run.stdout))
    assert COMMANDS[module] <= accepted, f"{module}: documented flags it does not take: {COMMANDS[module] - accepted}"


def test_documented_paths_exist():
    """Every test or script file the documents name (tests/.../x.py, scripts/x.py) is there."""
    named = {(path.name, match) for path in documents()
             for match in re.findall(r"(?<![\w/.])((?:tests|scripts)/[\w/]+\.py)", path.read_text(encoding="utf-8"))}
    assert {(doc, p) for doc, p in named if not (ROOT / p).exists()} == set()
