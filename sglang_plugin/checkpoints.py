"""WeDLM, Nemotron-Labs-Diffusion and Huginn checkpoints on SGLang without their remote code: the configs of
`common.checkpoint_configs` registered with transformers in every process, and, only when the served checkpoint
names one of their architectures, `sglang_plugin.models` as SGLang's external model package (an environment
variable the scheduler processes inherit; importing SGLang's model registry in every launch would cost seconds)."""

import json
import os
from pathlib import Path

from parallel_decoding.common.checkpoint_configs import ARCHITECTURES

MODEL_PACKAGE_ENV = "SGLANG_EXTERNAL_MODEL_PACKAGE"
MODEL_PACKAGE = "parallel_decoding.sglang_plugin.models"


def select_models(model_path: str) -> None:
    """Point SGLang at our model package when `model_path` is a local WeDLM, NLD or Huginn checkpoint."""
    config = Path(model_path) / "config.json"
    if not config.is_file():
        return
    architectures = json.loads(config.read_text(encoding="utf-8")).get("architectures") or []
    if set(architectures) & set(ARCHITECTURES):
        if os.environ.get(MODEL_PACKAGE_ENV, MODEL_PACKAGE) != MODEL_PACKAGE:
            raise SystemExit(f"error: {architectures[0]} needs {MODEL_PACKAGE_ENV}={MODEL_PACKAGE}, but it is set "
                             f"to {os.environ[MODEL_PACKAGE_ENV]!r}")
        os.environ[MODEL_PACKAGE_ENV] = MODEL_PACKAGE
