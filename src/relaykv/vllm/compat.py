"""The vLLM release this plugin was built and tested against, and the gate that refuses
any other (docs/vllm.md "Versions").

The plugin subclasses vLLM's scheduler, KV cache manager and NIXL connector, whose
internals change between minor releases: on an untested version it must refuse to load
with a clear message rather than misbehave silently.
"""

from __future__ import annotations

TESTED_VLLM_VERSION = "0.33.0"
INSTALL_HINT = f"pip install --no-deps vllm=={TESTED_VLLM_VERSION} (tools/vllm_venv.sh)"


class UnsupportedVLLMVersion(ImportError):
    """The installed vLLM is not the release relaykv.vllm was tested with."""


def version_problem(version: str) -> str | None:
    """Why `version` cannot run the plugin, or None when it can."""
    if version == TESTED_VLLM_VERSION:
        return None
    return (
        f"relaykv.vllm supports vLLM {TESTED_VLLM_VERSION} only, found vLLM {version}: the "
        "plugin subclasses vLLM's scheduler, KV cache manager and NIXL connector, whose "
        "internals change between releases, so it refuses to load rather than misbehave. "
        f"Install the tested release: {INSTALL_HINT}"
    )


def check_vllm_version() -> None:
    """Raise `UnsupportedVLLMVersion` unless the installed vLLM is the tested release."""
    import vllm

    problem = version_problem(getattr(vllm, "__version__", "unknown"))
    if problem is not None:
        raise UnsupportedVLLMVersion(problem)
