"""SGLang plugin (`sglang.srt.plugins` entry point): `--decode-mode` on `sglang.launch_server`, our speculative
workers, a CPU attention backend for verify windows, plain-torch stand-ins for missing CPU kernel ops, and WeDLM /
NLD checkpoints without remote code, Huginn's `RavenForCausalLM`.

Loaded by SGLang in the launching process and in every scheduler process. Without `--decode-mode` nothing is
selected and SGLang runs as without the plugin (the backend and algorithms are only registered, never chosen).
"""


def register() -> None:
    """Entry point; idempotent."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import get_spec

    from parallel_decoding.common.checkpoint_configs import register_configs
    from parallel_decoding.sglang_plugin import (
        attention,
        cli,
        request_state,
        requests,
        steady_decode,
        step_timer,
        waiting,
    )
    from parallel_decoding.sglang_plugin.cpu_ops import register_missing_ops

    register_missing_ops()
    register_configs()
    attention.register()
    HookRegistry.register("sglang.srt.server_args.ServerArgs.add_cli_args", cli.add_cli_args, HookType.AFTER)
    HookRegistry.register("sglang.srt.server_args.ServerArgs.from_cli_args", cli.from_cli_args, HookType.AROUND)
    HookRegistry.register("sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
                          requests.check_request, HookType.BEFORE)
    HookRegistry.register("sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode",
                          steady_decode.prepare_for_decode, HookType.AROUND)
    HookRegistry.register("sglang.srt.managers.schedule_batch.ScheduleBatch.check_decode_mem",
                          steady_decode.check_decode_mem, HookType.AROUND)
    HookRegistry.register("sglang.srt.managers.scheduler.Scheduler.process_batch_result",
                          steady_decode.count_step, HookType.AFTER)
    HookRegistry.register("sglang.srt.managers.scheduler.Scheduler.process_batch_result",
                          request_state.release_after_batch, HookType.AFTER)
    HookRegistry.register("sglang.srt.managers.scheduler.Scheduler.process_batch_result", waiting.tell_planner,
                          HookType.AFTER)
    HookRegistry.register("sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController."
                          "_add_speculative", request_state.report_entries, HookType.AFTER)
    for name in cli.ALGORITHMS.values():
        if get_spec(name) is None:
            SpeculativeAlgorithm.register(name, spec_class=spec_class())(worker_class)
    step_timer.install()
    engine_keywords()


def engine_keywords() -> None:
    """`decode_mode` / `decode_config` keywords on `sglang.Engine`, whose constructor loads plugins right before
    it builds its ServerArgs from its keywords (the engine module is loaded by then)."""
    import sys

    from sglang.srt.server_args import ServerArgs

    from parallel_decoding.sglang_plugin.cli import server_args_from_keywords

    engine = sys.modules.get("sglang.srt.entrypoints.engine")
    if engine is not None and engine.Engine.server_args_class is ServerArgs:
        engine.Engine.server_args_class = staticmethod(server_args_from_keywords)


def spec_class() -> type:
    """SGLang's custom-algorithm class, completed: SGLang 0.5.23's scheduler also calls methods only its builtin
    enum defines (`create_future_map`, `carries_draft_hidden_states`, ...); those run the enum's code on this
    object, whose identity checks (`is_eagle()`, `is_ngram()`, ...) all answer no."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    class WindowAlgorithm(CustomSpecAlgo):
        def __getattr__(self, name: str):
            method = getattr(SpeculativeAlgorithm, name, None)
            if name.startswith("_") or not callable(method):
                raise AttributeError(name)
            return method.__get__(self)

    return WindowAlgorithm


def worker_class(server_args: object) -> type:
    """The worker SGLang builds for our algorithms (imported only once one is selected)."""
    from parallel_decoding.sglang_plugin.cli import commits, decode_settings

    mode, config = decode_settings(server_args)
    if mode == "huginn":
        from parallel_decoding.sglang_plugin.huginn import HuginnWorker

        return HuginnWorker
    if commits(mode, config):
        from parallel_decoding.sglang_plugin.commit import CommitWorker

        return CommitWorker
    from parallel_decoding.sglang_plugin.verify import VerifyWorker

    return VerifyWorker
