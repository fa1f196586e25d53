"""Stand-in for SGLang's compiled `common_ops` where it cannot load (CPU machines without SGLang's CPU kernel build).

`sgl_kernel` falls back to `import common_ops` when its compiled library fails; this module then defines, in plain
torch, the few `sgl_kernel` ops SGLang calls on CPU. Where the real library loads, this module is never imported.
"""

from parallel_decoding.sglang_plugin.cpu_ops import register_missing_ops

register_missing_ops()
