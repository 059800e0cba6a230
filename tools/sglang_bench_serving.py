"""Run SGLang's `sglang.bench_serving` next to a CPU-only torch (docs/benchmarking.md).

SGLang 0.5.23 imports `torchvision.transforms` at module level in its multimodal helpers
(`sglang.srt.multimodal.internvl_utils`, reached from `import sglang`). PyPI's torchvision
wheels link CUDA torch libraries (`libtorch_cuda.so`), so next to torch 2.13.0+cpu the real
one does not import (`operator torchvision::nms does not exist`). A text benchmark never
calls those helpers, so this launcher:

1. asks transformers, while no torchvision is importable, whether torchvision is available
   (it caches the answer, False), so transformers keeps its text-only code paths;
2. puts a stand-in `torchvision` package on sys.path whose every attribute is a placeholder
   that raises NotImplementedError when called;
3. runs `sglang.bench_serving` as `__main__` with the remaining arguments, unchanged.

Usage: CLIENT_VENV/bin/python tools/sglang_bench_serving.py --backend vllm --base-url URL ...
"""

from __future__ import annotations

import runpy
import sys
import tempfile
from pathlib import Path

STUB = '''
class _Placeholder:
    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        return _Placeholder(self._name + "." + attr)

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(self._name + ": torchvision stand-in (text benchmarks only)")

    def __mro_entries__(self, bases):
        return (object,)


def __getattr__(attr):
    return _Placeholder(__name__ + "." + attr)
'''
MODULES = ("torchvision", "torchvision/transforms", "torchvision/transforms/v2")


def install_stub(root: Path) -> None:
    for module in MODULES:
        (root / module).mkdir(parents=True, exist_ok=True)
        (root / module / "__init__.py").write_text(STUB)
    (root / "torchvision" / "transforms" / "functional.py").write_text(STUB)


def main() -> None:
    from transformers.utils import import_utils

    if import_utils.is_torchvision_available():  # a working torchvision: nothing to do
        runpy.run_module("sglang.bench_serving", run_name="__main__", alter_sys=True)
        return
    stub_root = Path(tempfile.mkdtemp(prefix="torchvision-stub-"))
    install_stub(stub_root)
    sys.path.append(str(stub_root))
    sys.argv[0] = "sglang.bench_serving"
    runpy.run_module("sglang.bench_serving", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
