"""`--decode-mode` and `--decode-config` on `sglang.launch_server`, translated into SGLang's own speculative fields.

The method config is parsed by `common/` (unknown keys and bad values refused naming the field) and completed
from the checkpoint (mask token, `dlm_type`) in the launching process, before any model loads; the scheduler
processes read it back from `ServerArgs` (`decode_settings`).
"""

import dataclasses
import json
import sys
from typing import Any

from common.draft_layout import complete_config
from common.errors import ConfigError
from common.methods import parse_config

# Modes served on SGLang, each as a registered speculative algorithm.
ALGORITHMS = {"diffusion_self": "PD_DIFFUSION_SELF", "jacobi": "PD_JACOBI"}
CPU_ATTENTION_BACKEND = "pd_torch_sdpa"


def add_cli_args(result: Any, parser: Any) -> None:
    """AFTER hook on `ServerArgs.add_cli_args`: our two flags."""
    group = parser.add_argument_group("parallel decoding (parallel-decoding plugin)")
    group.add_argument("--decode-mode", choices=sorted(ALGORITHMS), default=None,
                       help="decode with a parallel decoder instead of one token per forward")
    group.add_argument("--decode-config", default=None, metavar="JSON",
                       help='the mode settings, a JSON object or .json file, e.g. {"num_speculative_tokens": 8}')


def from_cli_args(original: Any, cls: Any, args: Any) -> Any:
    """AROUND hook on `ServerArgs.from_cli_args`: rewrite our flags into SGLang's fields, then build the args."""
    mode, settings = getattr(args, "decode_mode", None), getattr(args, "decode_config", None)
    for name in ("decode_mode", "decode_config"):
        if hasattr(args, name):
            delattr(args, name)
    if mode is None:
        if settings is not None:
            sys.exit("error: argument --decode-config: needs --decode-mode (one of "
                     f"{', '.join(sorted(ALGORITHMS))})")
        return original(cls, args)
    try:
        config = complete(parse_config(mode, settings), args.model_path, args.trust_remote_code)
    except ConfigError as err:
        sys.exit(f"error: argument --decode-config: {err}")
    apply(args, mode, config)
    server_args = original(cls, args)
    server_args._decode_settings = json.dumps({"mode": mode, "config": dataclasses.asdict(config)})
    return server_args


def complete(config: Any, model_path: str, trust_remote_code: bool) -> Any:
    """The config with what the checkpoint decides filled in (`common.draft_layout.complete_config`)."""
    from transformers import AutoConfig, AutoTokenizer

    model_config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    return complete_config(
        config, model_config, lambda: AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code))


def window_size(mode: str, config: Any) -> int:
    """Tokens per request in each verify forward: the seed and the most drafts a step may carry."""
    if mode == "jacobi":
        return config.block_size * config.num_blocks + 1
    return config.num_speculative_tokens + 1


def apply(args: Any, mode: str, config: Any) -> None:
    """SGLang's fields for a mode: our registered algorithm, one fixed-width chain window, no overlap."""
    if mode == "jacobi" and config.pool_size:
        raise SystemExit("error: argument --decode-config: pool_size must be 0 on SGLang (rejection recycling "
                         f"verifies several branches in one forward), got {config.pool_size}")
    args.speculative_algorithm = ALGORITHMS[mode]
    args.speculative_num_draft_tokens = window_size(mode, config)
    args.speculative_num_steps = 1
    args.speculative_eagle_topk = 1
    args.disable_overlap_schedule = True
    if args.device == "cpu":
        args.attention_backend = CPU_ATTENTION_BACKEND


def decode_settings(server_args: Any) -> tuple[str, Any]:
    """The mode and its typed, completed config, as the launching process resolved them."""
    settings = json.loads(server_args._decode_settings)
    return settings["mode"], parse_config(settings["mode"], settings["config"])
