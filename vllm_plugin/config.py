"""Front end: our methods in `--speculative-config` become vLLM's `custom_class` proposer path.

`{"method": "diffusion_self", "num_speculative_tokens": 4}` is checked against the method's typed config from
`common/` (unknown keys and bad values are refused naming the field), the mask token is resolved from the
checkpoint, and the engine args are rewritten to `{"method": "custom_class", "model": <our proposer>, ...}`
with the typed config in `additional_config`, which vLLM pickles to every worker.
"""

import argparse
import dataclasses
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from parallel_decoding.common.draft_layout import complete_config
from parallel_decoding.common.errors import ConfigError
from parallel_decoding.common.huginn.config import check_engine_config
from parallel_decoding.common.lora import adapter_path
from parallel_decoding.common.methods import (
    check_architecture,
    commits,
    decoding_method,
    max_drafts,
    method_spec,
    parse_config,
)
from parallel_decoding.vllm_plugin import streaming
from parallel_decoding.vllm_plugin.logprobs import RAW_MODES

SUPPORTED_VLLM = ((0, 32), (0, 34))
MAX_SPEC_LEN = 128
ADDITIONAL_CONFIG_KEY = "parallel_decoding"
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
# Set once the command line named one of our methods: a refusal found later (the mask token, which needs the
# checkpoint) then ends the process with a message as argparse's do; the offline API keeps raising ConfigError.
_cli = {"named_ours": False}


@dataclass(frozen=True)
class EngineMethod:
    """How a `common/` method maps onto vLLM: its proposer class and, if it drafts ahead, its scheduler."""

    proposer: str
    scheduler: str | None = None


_P = "parallel_decoding.vllm_plugin"
METHODS = {
    "diffusion_self": EngineMethod(f"{_P}.diffusion_self.DiffusionSelfProposer", f"{_P}.scheduler.LookaheadScheduler"),
    "jacobi": EngineMethod(f"{_P}.jacobi.JacobiProposer", f"{_P}.scheduler.CarryingScheduler"),
    "wedlm": EngineMethod(f"{_P}.wedlm.WeDLMProposer", f"{_P}.scheduler.WindowScheduler"),
    "diffusion": EngineMethod(f"{_P}.diffusion.DiffusionProposer", f"{_P}.scheduler.LookaheadScheduler"),
    "huginn": EngineMethod(f"{_P}.huginn.HuginnProposer", f"{_P}.scheduler.CommitScheduler"),
    "wedlm_spec": EngineMethod(f"{_P}.wedlm_spec.WeDLMSpecProposer", f"{_P}.scheduler.CarryingScheduler"),
}
QUADRATIC = EngineMethod(f"{_P}.quadratic_self_spec.QuadraticSelfSpecProposer", f"{_P}.scheduler.CommitScheduler")
def engine_method(method: str, config: Any) -> EngineMethod:
    """The proposer (and scheduler) serving `method` with `config`."""
    return QUADRATIC if decoding_method(method, config)[0] == "diffusion_self_quadratic" else METHODS[method]


def engine_config(settings: dict[str, Any]) -> tuple[str, Any]:
    """(method, typed config) for a `--speculative-config` object naming one of our methods."""
    settings = dict(settings)
    method = settings.pop("method")
    config = parse_config(method, settings)
    if method == "huginn":
        check_engine_config(config, "vLLM")
    if method == "jacobi" and config.pool_size and config.recycling != "linear":
        raise ConfigError(
            "recycling must be 'linear' under vLLM when pool_size > 0: its verifier takes one linear draft, not "
            f"candidate branches beside it; got {config.recycling!r}"
        )
    k = max_drafts(method, config)
    if k > MAX_SPEC_LEN:
        raise ConfigError(f"{method_spec(method).width_rule} must give at most {MAX_SPEC_LEN} draft tokens per step "
                          f"(vLLM's limit), got {k}")
    return method, config


def is_ours(settings: Any) -> bool:
    return isinstance(settings, dict) and settings.get("method") in METHODS


def check_vllm_version(version: str) -> None:
    """Refuse a vLLM outside the range whose private hooks this adapter was written against."""
    numbers = tuple(int(part) for part in version.split("+")[0].split(".")[:2])
    low, high = SUPPORTED_VLLM
    if not low <= numbers < high:
        raise ConfigError(
            f"parallel-decoding supports vLLM >= {'.'.join(map(str, low))}, < {'.'.join(map(str, high))}; "
            f"found {version}"
        )


def v2_runner_env() -> bool:
    """Whether VLLM_USE_V2_MODEL_RUNNER asks for vLLM's V2 model runner ("1" or "true", any case)."""
    import vllm.envs as envs

    try:
        return bool(getattr(envs, V2_RUNNER_ENV))  # vLLM's own reading: bool(int(value)), None when unset
    except (AttributeError, ValueError):  # a vLLM without the variable, or a value its int() refuses ("true")
        return os.environ.get(V2_RUNNER_ENV, "").strip().lower() in ("1", "true")


def v2_runner_selected(engine_args: Any) -> str | None:
    """What puts vLLM on its V2 model runner despite `custom_class` (which alone keeps V1), and how to undo it."""
    if v2_runner_env():
        return f"{V2_RUNNER_ENV}={os.environ.get(V2_RUNNER_ENV)} selects V2: unset {V2_RUNNER_ENV} (or set it to 0)"
    if getattr(engine_args, "watermark_config", None) is not None:
        return "--watermark-config selects V2 (watermarking runs on V2 only): drop --watermark-config"
    kv_transfer = getattr(engine_args, "kv_transfer_config", None)
    if getattr(getattr(engine_args, "attention_config", None), "hisparse_config", None) is not None or (
        callable(getattr(kv_transfer, "has_connector", None)) and kv_transfer.has_connector("HiSparseConnector")
    ):
        return ("HiSparse selects V2 (it runs on V2 only): drop attention_config.hisparse_config and any "
                "HiSparseConnector from --kv-transfer-config")
    return None


def load_tokenizer(model_config: Any) -> Any:
    """vLLM's tokenizer for the model, or None where vLLM is told not to load one."""
    if model_config.skip_tokenizer_init:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_config.tokenizer, trust_remote_code=model_config.trust_remote_code)


def refuse(err: ConfigError) -> NoReturn:
    """Raise `err`, or end the process with its one-line message when the command line named our method."""
    if _cli["named_ours"]:
        raise SystemExit(f"error: {err}") from None
    raise err


def translate(engine_args: Any, model_config: Any) -> None:
    """Rewrite `engine_args` in place from one of our methods to vLLM's `custom_class` path."""
    import vllm

    check_vllm_version(vllm.__version__)
    method, config = engine_config(engine_args.speculative_config)
    selected = v2_runner_selected(engine_args)
    if selected is not None:
        refuse(ConfigError(f"method {method}: parallel-decoding hooks vLLM's V1 model runner (GPUModelRunner) and "
                           f"does not run on Model Runner V2; {selected}"))
    if method == "huginn" and engine_args.tensor_parallel_size > 1:
        refuse(ConfigError("method huginn runs with tensor_parallel_size 1 only (RavenForCausalLM's layers are not "
                           f"sharded here), got {engine_args.tensor_parallel_size}"))
    if commits(method, config) and engine_args.logprobs_mode not in RAW_MODES:
        refuse(ConfigError(f"method {method} reports logprobs_mode {' or '.join(RAW_MODES)} (its decoder, not vLLM's "
                           f"sampler, processes the logits), got {engine_args.logprobs_mode!r}"))
    architectures = getattr(model_config.hf_config, "architectures", None) or []
    try:
        check_architecture(method, architectures)
        config = complete_config(config, model_config.hf_config, lambda: load_tokenizer(model_config))
        if getattr(config, "draft_adapter", None):
            config = with_adapter(config, model_config.model, engine_args.enforce_eager)
    except ConfigError as err:
        refuse(err)
    target = engine_method(method, config)
    if target.scheduler is not None:
        if engine_args.scheduler_cls not in (None, target.scheduler):
            refuse(ConfigError(f"scheduler_cls must be unset for {method} (it runs on its own scheduler), "
                               f"got {engine_args.scheduler_cls!r}"))
        engine_args.scheduler_cls = target.scheduler
    if method == "huginn":
        # each forward reads the rows staged for it: no graph may replay an old one
        engine_args.enforce_eager = model_config.enforce_eager = True
    engine_args.additional_config = {
        **(engine_args.additional_config or {}),
        ADDITIONAL_CONFIG_KEY: {"method": method, "config": dataclasses.asdict(config),
                                "committing": commits(method, config)},
    }
    engine_args.speculative_config = {
        "method": "custom_class",
        "model": target.proposer,
        "num_speculative_tokens": max_drafts(method, config),
    }
    streaming.install()  # this process serves our method: its parsers read our multi-token steps token by token


def with_adapter(config: Any, model: str, enforce_eager: bool) -> Any:
    """The config naming its draft adapter by absolute path (checked to be a PEFT directory; relative paths are the
    checkpoint's own, as NLD's `linear_spec_lora/`). The adapter is a forward hook on the draft pass, which a
    compiled graph would not run: eager mode only."""
    if not enforce_eager:
        raise ConfigError("draft_adapter needs enforce_eager under vLLM (the adapter is switched on in the draft pass "
                          "by a hook that vLLM's compiled graph would skip); pass --enforce-eager")
    return dataclasses.replace(config, draft_adapter=str(adapter_path(model, config.draft_adapter).resolve()))


def checked(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """Wrap the argparse type of `--speculative-config` so our methods' fields are checked at parse time."""

    @functools.wraps(parse)
    def parse_checked(text: str) -> Any:
        value = parse(text)
        if is_ours(value):
            _cli["named_ours"] = True
            try:
                engine_config(value)
            except ConfigError as err:
                raise argparse.ArgumentTypeError(str(err)) from None
        return value

    return parse_checked


def install() -> None:
    """Wrap `EngineArgs.create_speculative_config` and the CLI's `--speculative-config` type (idempotent)."""
    from vllm.engine.arg_utils import EngineArgs

    if getattr(EngineArgs.create_speculative_config, "parallel_decoding", False):
        return
    create = EngineArgs.create_speculative_config
    add_cli_args = EngineArgs.add_cli_args

    @functools.wraps(create)
    def create_speculative_config(self: Any, target_model_config: Any, target_parallel_config: Any) -> Any:
        if is_ours(self.speculative_config):
            translate(self, target_model_config)
        return create(self, target_model_config, target_parallel_config)

    @functools.wraps(add_cli_args)
    def add_cli_args_checked(parser: Any, *args: Any, **kwargs: Any) -> Any:
        parser = add_cli_args(parser, *args, **kwargs)
        for action in parser._actions:
            if "--speculative-config" in action.option_strings:
                action.type = checked(action.type)
        return parser

    create_speculative_config.parallel_decoding = True
    EngineArgs.create_speculative_config = create_speculative_config
    EngineArgs.add_cli_args = staticmethod(add_cli_args_checked)
