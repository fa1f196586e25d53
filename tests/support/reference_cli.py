"""The oracle the engine tests of the commit-rule methods compare against: `parallel-decoding generate`."""

import json
import math
import subprocess
import sys
from pathlib import Path

from parallel_decoding.common.sampling import SamplingParams

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


# The penalties and a bias an SGLang test request sends, and the same as the reference runner takes them (SGLang's
# definitions).
SGLANG_ADJUSTED = {"presence_penalty": 0.5, "frequency_penalty": 0.4, "repetition_penalty": 1.5,
                   "logit_bias": {"5": 2.0}}
SGLANG_REFERENCE_ADJUSTED = SamplingParams(
    **{k: v for k, v in SGLANG_ADJUSTED.items() if k != "logit_bias"},
    logit_bias=tuple((int(t), b) for t, b in SGLANG_ADJUSTED["logit_bias"].items()), rules="sglang")
HELD = 8  # `min_tokens` of the engine tests: the stop tokens held back for the first 8 output tokens


def held_reference(model_dir: str | Path, spec: dict | None, prompts: list[str]
                   ) -> tuple[list[int], list[list[int]], list[list[float]]]:
    """Per prompt, a stop token its plain greedy output (spec None: AR's) reaches third, and the reference runner's
    tokens and margins when that token and EOS end the request and are held back for the first `HELD` tokens."""
    from parallel_decoding.common.checkpoint import eos_token_ids, load
    from parallel_decoding.common.decoder import Limits
    from parallel_decoding.common.methods import make_decoder, parse_config
    from parallel_decoding.common.runner import ReferenceRunner
    from parallel_decoding.common.sampling import SamplingParams

    model, tokenizer = load(model_dir)
    method = "ar" if spec is None else spec["method"]
    config = None if spec is None else parse_config(method, json.loads(settings(spec)),
                                                    mask_token_id=model.config.mask_token_id)
    runner, eos = ReferenceRunner(model), eos_token_ids(model, tokenizer)
    stops, tokens, margins = [], [], []
    for prompt in prompts:
        ids = tokenizer.encode(prompt)
        stop = runner.run(make_decoder(method, config, ids, SamplingParams(), Limits(MAX_TOKENS))).token_ids[2]
        held = SamplingParams(min_tokens=HELD, stop_token_ids=(stop, *eos))
        result = runner.run(make_decoder(method, config, ids, held, Limits(MAX_TOKENS, eos_token_ids=(stop, *eos))))
        stops.append(stop)
        tokens.append(result.token_ids)
        margins.append(result.margins)
    return stops, tokens, margins


def adjusted_reference(model_dir: str | Path, spec: dict | None, prompts: list[str], params
                       ) -> tuple[list[list[int]], list[list[float]]]:
    """The reference runner's greedy tokens and margins per prompt under `params` (a `SamplingParams` with
    penalties, a bias; spec None: AR's)."""
    from parallel_decoding.common.checkpoint import load
    from parallel_decoding.common.decoder import Limits
    from parallel_decoding.common.methods import make_decoder, parse_config
    from parallel_decoding.common.runner import ReferenceRunner

    model, tokenizer = load(model_dir)
    method = "ar" if spec is None else spec["method"]
    config = None if spec is None else parse_config(method, json.loads(settings(spec)),
                                                    mask_token_id=model.config.mask_token_id)
    runner = ReferenceRunner(model)
    runs = [runner.run(make_decoder(method, config, tokenizer.encode(p), params, Limits(MAX_TOKENS))) for p in prompts]
    return [r.token_ids for r in runs], [r.margins for r in runs]
