"""Every command of ours that the README, docs/ or a docstring shows (`python -m scripts...` or
`parallel-decoding SUBCOMMAND`) names a module or subcommand that exists and flags it accepts: each one's `--help`
is run once and every flag a documented command passes must be in it (a renamed flag or module fails here, not in a
reader's terminal)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from parallel_decoding.common.cli import SUBCOMMANDS

ROOT = Path(__file__).resolve().parents[2]
OURS = ("common", "scripts", "vllm_plugin", "sglang_plugin")
COMMAND = re.compile(r"(python -m (?:scripts|parallel_decoding)(?:\.\w+)+|parallel-decoding (?:"
                     + "|".join(SUBCOMMANDS) + r"))([^`\n]*)")


def documents() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for package in OURS:
        files += sorted((ROOT / package).rglob("*.py"))
    return [f for f in files if f.is_file()]


def commands() -> dict[str, set[str]]:
    """Per command (`python -m MODULE` or `parallel-decoding SUB`), the flags its documented uses pass."""
    found: dict[str, set[str]] = {}
    for path in documents():
        text = re.sub(r"\\+\n\s*", " ", path.read_text(encoding="utf-8"))
        for command, rest in COMMAND.findall(text):
            flags = {m for m in re.findall(r"(?<![\w-])--[a-z][\w-]*", rest)}
            found.setdefault(command, set()).update(flags)
    return found


COMMANDS = commands()


def test_the_documents_show_commands():
    assert {"parallel-decoding generate", "python -m scripts.bench", "python -m scripts.serve_demo"} <= set(COMMANDS)


@pytest.fixture(scope="module")
def help_texts() -> dict[str, tuple[int, str]]:
    """Every documented command's `--help` (exit status, output), from one process (`tests.support.help_texts`)."""
    run = subprocess.run([sys.executable, "-m", "tests.support.help_texts", *sorted(COMMANDS)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_documented_flags_exist(help_texts, command):
    status, text = help_texts[command]
    assert status == 0, text[-2000:]
    accepted = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", text))
    missing = COMMANDS[command] - accepted
    assert not missing, f"{command}: documented flags it does not take: {missing}"


def test_documented_paths_exist():
    """Every test or script file the documents name (tests/.../x.py, scripts/x.py) is there."""
    named = {(path.name, match) for path in documents()
             for match in re.findall(r"(?<![\w/.])((?:tests|scripts)/[\w/]+\.py)", path.read_text(encoding="utf-8"))}
    assert {(doc, p) for doc, p in named if not (ROOT / p).exists()} == set()


def test_the_scripts_index_names_every_script():
    """`scripts/README.md` names each script, shell script and folder under scripts/."""
    index = (ROOT / "scripts" / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([\w./-]+)`", index))
    present = {p.name + ("/" if p.is_dir() else "") for p in (ROOT / "scripts").iterdir()
               if p.name not in {"__init__.py", "README.md", "__pycache__"}}
    assert present - named == set()


def test_the_readme_is_a_front_page():
    """Details and measurements live in docs/: the README stays under 12 KB."""
    assert (ROOT / "README.md").stat().st_size < 12_000
