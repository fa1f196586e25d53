"""Let the registry's `torchvision` (a CUDA build) import beside CPU torch in SGLang's CPU test environment.

SGLang and `transformers` import `torchvision` at start-up; PyPI has only CUDA builds of it, whose compiled ops cannot
load beside CPU torch, and `torchvision` then fails registering fake kernels for two ops that were never defined.
Defining their schemas first (no kernels: calling one raises) lets the pure-torch rest of `torchvision` work.
`scripts/setup_sglang_env.sh` installs `install()` as a start-up hook of that environment only; the hook imports
nothing until `torchvision` is first imported.
"""

import importlib.abc
import sys

_SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
            "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_library: list = []


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    """Runs `define_missing_ops` once, just before the first `import torchvision`; finds nothing itself."""

    def find_spec(self, name: str, path: object, target: object = None) -> None:
        if name == "torchvision":
            sys.meta_path.remove(self)
            define_missing_ops()
        return None


def define_missing_ops() -> list[str]:
    """Define each `torchvision::<op>` schema that is missing (CPU torch with no CUDA runtime); returns those added."""
    import torch

    if torch.version.cuda is not None:
        return []
    added = []
    for schema in _SCHEMAS:
        name = schema.split("(")[0]
        if not hasattr(torch.ops.torchvision, name):
            if not _library:
                _library.append(torch.library.Library("torchvision", "FRAGMENT"))
            _library[0].define(schema)
            added.append(name)
    return added


def install() -> None:
    """Put the hook first on `sys.meta_path`; idempotent."""
    if not any(isinstance(finder, _BeforeTorchvision) for finder in sys.meta_path):
        sys.meta_path.insert(0, _BeforeTorchvision())
