"""`--decode-mode` and `--decode-config` on `sglang.launch_server` (and the same keyword arguments on
`sglang.Engine`), translated into SGLang's own speculative fields.

The method config is parsed by `common/` (unknown keys and bad values refused naming the field) and completed
from the checkpoint (mask token, `dlm_type`) in the launching process, before any model loads; the scheduler
processes read it back from `ServerArgs` (`decode_settings`).
"""

import dataclasses
import json
import sys
from typing import Any

from parallel_decoding.common.draft_layout import complete_config
from parallel_decoding.common.errors import ConfigError
from parallel_decoding.common.huginn.config import check_engine_config
from parallel_decoding.common.lora import adapter_path
from parallel_decoding.common.methods import check_architecture, decoding_method, max_drafts, method_spec, parse_config
from parallel_decoding.common.methods import commits as decoder_commits
from parallel_decoding.sglang_plugin.checkpoints import select_models

# Modes served on SGLang, each as a registered speculative algorithm.
ALGORITHMS = {"diffusion_self": "PD_DIFFUSION_SELF", "jacobi": "PD_JACOBI", "wedlm": "PD_WEDLM",
              "diffusion": "PD_DIFFUSION", "huginn": "PD_HUGINN", "wedlm_spec": "PD_WEDLM_SPEC"}
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
    select_models(args.model_path)
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
        config, fields = resolve(mode, settings, args.model_path, args.trust_remote_code, args.device)
    except ConfigError as err:
        sys.exit(f"error: argument --decode-config: {err}")
    for name, value in fields.items():
        setattr(args, name, value)
    server_args = original(cls, args)
    try:
        check_resolved(mode, config, server_args)
    except ConfigError as err:
        sys.exit(f"error: {err}")
    server_args._decode_settings = encode(mode, config)
    return server_args


def server_args_from_keywords(**kwargs: Any) -> Any:
    """`sglang.Engine`'s ServerArgs constructor while the plugin is loaded: the same settings as keyword arguments,
    `Engine(model_path=..., decode_mode="wedlm", decode_config={...})`. Bad ones raise `ConfigError`."""
    from sglang.srt.server_args import ServerArgs

    if "model_path" in kwargs:
        select_models(kwargs["model_path"])
    mode, settings = kwargs.pop("decode_mode", None), kwargs.pop("decode_config", None)
    if mode is None:
        if settings is not None:
            raise ConfigError(f"decode_config needs decode_mode (one of {sorted(ALGORITHMS)})")
        return ServerArgs(**kwargs)
    if mode not in ALGORITHMS:
        raise ConfigError(f"decode_mode must be one of {sorted(ALGORITHMS)}, got {mode!r}")
    config, fields = resolve(mode, settings, kwargs["model_path"], kwargs.get("trust_remote_code", False),
                             kwargs.get("device"))
    server_args = ServerArgs(**{**kwargs, **fields})
    check_resolved(mode, config, server_args)
    server_args._decode_settings = encode(mode, config)
    return server_args


def resolve(mode: str, settings: Any, model_path: str, trust_remote_code: bool, device: str | None
            ) -> tuple[Any, dict[str, Any]]:
    """The mode's typed config, completed from the checkpoint, and the SGLang fields that select it."""
    config = complete(parse_config(mode, settings), model_path, trust_remote_code)
    check_huginn(mode, config, model_path, trust_remote_code)
    if getattr(config, "draft_adapter", None):  # by absolute path, checked (relative: the checkpoint's own)
        path = adapter_path(model_path, config.draft_adapter).resolve()
        config = dataclasses.replace(config, draft_adapter=str(path))
    return config, speculative_fields(mode, config, device)


def check_huginn(mode: str, config: Any, model_path: str, trust_remote_code: bool) -> None:
    """`huginn` serves Raven checkpoints, which no other mode serves; its engine samplers and cache layout."""
    from transformers import AutoConfig

    architectures = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code).architectures or []
    check_architecture(mode, architectures, noun="decode mode")
    if mode == "huginn":
        check_engine_config(config, "SGLang")


def encode(mode: str, config: Any) -> str:
    """What the scheduler processes read back (`decode_settings`), carried on `ServerArgs`."""
    return json.dumps({"mode": mode, "config": dataclasses.asdict(config)})


def complete(config: Any, model_path: str, trust_remote_code: bool) -> Any:
    """The config with what the checkpoint decides filled in (`common.draft_layout.complete_config`)."""
    from transformers import AutoConfig, AutoTokenizer

    model_config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    return complete_config(
        config, model_config, lambda: AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code))


def commits(mode: str, config: Any) -> bool:
    """Whether the mode's `common/` decoder commits (`sglang_plugin.commit`) rather than our worker verifying one
    linear draft (`sglang_plugin.verify`): the step modes whose decoder commits by its own rule (`common.methods`),
    and here also Jacobi with rejection recycling, whose recycled branches share the main draft's forward and win
    with KV out of place. Huginn has a worker of its own."""
    if method_spec(mode).kind != "step":
        return False
    return decoder_commits(mode, config) or (mode == "jacobi" and config.pool_size > 0)


def window_size(mode: str, config: Any) -> int:
    """SGLang's per-step width: twice it is the KV it reserves past its cached tokens. A verify window is the
    seed and the most drafts; an NLD forward is one block. A WeDLM forward is up to 2W rows (the committing run
    and a full window) after up to W rows recomputed once a prefill ends, and the batch's widest forward is laid
    from every request's start, up to one past SGLang's cached tokens: 3W + 1 must fit in twice the width.
    Recycling Jacobi forwards K blocks of n drafts and V branches of n, after up to n + 1 tokens a winning branch
    left uncached, and a retracted request may recompute n + 1 more. WeDLM-drafted speculation verifies the seed,
    up to W - 1 drafts and W mask slots. Quadratic self-speculation forwards a chain of up to k = n + 1 tokens and
    a group of k + 1 rows per chain token."""
    if mode == "jacobi" and config.pool_size:
        return (config.num_blocks + config.verification_size + 2) * config.block_size // 2 + 1
    if mode == "wedlm":
        return (3 * config.window + 2) // 2
    if mode == "huginn":
        return (config.max_wavefront + 1) // 2 if config.sampler == "wavefront" else 1
    rows = max_drafts(mode, config) + 1
    return (rows + 1) // 2 if decoding_method(mode, config)[0] == "diffusion_self_quadratic" else rows


def speculative_fields(mode: str, config: Any, device: str | None) -> dict[str, Any]:
    """SGLang's fields for a mode: our registered algorithm, one fixed-width window, no overlap; on CPU our
    attention backend."""
    fields = {"speculative_algorithm": ALGORITHMS[mode], "speculative_num_draft_tokens": window_size(mode, config),
              "speculative_num_steps": 1, "speculative_eagle_topk": 1, "disable_overlap_schedule": True}
    if mode == "huginn":
        fields["disable_radix_cache"] = True  # a prefix's KV depends on the request's latents
        fields["disable_cuda_graph"] = True  # each forward reads the rows staged for it: no graph may replay one
    if device == "cpu":
        fields["attention_backend"] = CPU_ATTENTION_BACKEND
    return fields


def check_resolved(mode: str, config: Any, server_args: Any) -> None:
    """What SGLang resolves while building its args and a mode cannot take: KV pages (some attention backends force
    them), which the modes whose decoder commits cannot take (their scratch windows take slots one token at a time);
    tensor parallelism on CPU, where this environment's SGLang starts NCCL (CUDA only) for its workers."""
    if server_args.device == "cpu" and server_args.tp_size > 1:
        raise ConfigError(f"tp_size must be 1 with --decode-mode on device cpu (SGLang's CPU workers here would start "
                          f"NCCL, which needs CUDA), got {server_args.tp_size}")
    page_size = server_args.page_size or 1
    if commits(mode, config) and page_size > 1:
        raise ConfigError(f"page_size must be 1 with decode mode {mode} (its scratch windows take KV slots one token "
                          f"at a time), got {page_size}")


def decode_settings(server_args: Any) -> tuple[str, Any]:
    """The mode and its typed, completed config, as the launching process resolved them."""
    settings = json.loads(server_args._decode_settings)
    return settings["mode"], parse_config(settings["mode"], settings["config"])
