"""The oracle the engine tests of the commit-rule methods compare against: `parallel-decoding generate`."""

import json
import math
import subprocess
import sys
from pathlib import Path

MAX_TOKENS = 29
SEED = 7


def settings(spec: dict) -> str:
    """A method spec `{"method": ..., **settings}` as the settings JSON the engines and the CLI take."""
    return json.dumps({k: v for k, v in spec.items() if k != "method"})


def reference(model_dir: str | Path, spec: dict, prompts: list[str], tmp_path: Path, temperature: float,
              max_tokens: int = MAX_TOKENS) -> tuple[list[list[int]], list[list[float]]]:
    """`parallel-decoding generate` on the prompts (EOS from the checkpoint, `SEED` for every prompt): token ids
    and decision margins (for `tests.ties.compare`) per prompt."""
    prompts_file, out = tmp_path / "prompts.txt", tmp_path / f"out-{temperature}-{max_tokens}.json"
    prompts_file.write_text("\n".join(prompts) + "\n")
    cmd = [sys.executable, "-m", "parallel_decoding.common.generate", "--model", str(model_dir),
           "--method", spec["method"],
           "--config", settings(spec), "--max-tokens", str(max_tokens), "--temperature", str(temperature),
           "--seed", str(SEED), "--prompts-file", str(prompts_file), "--json", str(out)]
    subprocess.run(cmd, check=True, capture_output=True)
    records = json.loads(out.read_text())
    margins = [[math.inf if m is None else m for m in record["margins"]] for record in records]
    return [record["token_ids"] for record in records], margins
