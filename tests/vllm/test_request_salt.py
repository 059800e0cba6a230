"""relaykv keys a vLLM request's blocks under vLLM's extra keys too (relaykv/vllm/request_salt.py):
requests with equal token ids but different LoRA adapters or prompt embeddings never share."""

from __future__ import annotations

import pytest

from tests.vllm.conftest import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

import torch
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher
from vllm.v1.request import Request

from relaykv.kvcache.geometry import preset
from relaykv.vllm.probe import EngineSpec, StandInWorker, _run_to_end, build_scheduler
from relaykv.vllm.request_salt import request_salt

PROMPT = list(range(1, 301))


def _req(rid: str, **kw) -> Request:
    return Request(
        rid,
        list(PROMPT),
        SamplingParams(max_tokens=1, ignore_eos=True),
        None,
        block_hasher=get_request_block_hasher(16, sha256),
        **kw,
    )


def _lora(name: str, path: str = "/adapters/x") -> LoRARequest:
    return LoRARequest(name, 1, path)


def _hits_after(model_dirs, policy: str, first: dict, second: dict) -> int:
    spec = EngineSpec(preset("gpt-oss-like"), {"pd_policy": policy}, None, "E", 512, 4096)
    s = build_scheduler(spec, model_dirs)
    worker = StandInWorker(s)
    s.add_request(_req("a", **first))
    _run_to_end(worker, "a")
    return s.kv_cache_manager.get_computed_blocks(_req("b", **second))[1]


def _posing_as_x() -> str | None:
    """The salt an unsalted request with adapter x is keyed under (sent by a plain one)."""
    return request_salt(_req("v", lora_request=_lora("x")))


CASES = {
    "same adapter": ({"lora_request": _lora("x")}, {"lora_request": _lora("x")}, True),
    "other adapter": ({"lora_request": _lora("x")}, {"lora_request": _lora("y")}, False),
    "adapter re-pointed": (
        {"lora_request": _lora("x")},
        {"lora_request": _lora("x", "/adapters/x2")},
        False,
    ),
    "base vs adapter": ({}, {"lora_request": _lora("x")}, False),
    "same salt": ({"cache_salt": "t1"}, {"cache_salt": "t1"}, True),
    "other salt": ({"cache_salt": "t1"}, {"cache_salt": "t2"}, False),
    "plain request posing as an adapter": (
        {"lora_request": _lora("x")},
        {"cache_salt": _posing_as_x},
        False,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_extra_keys_keep_requests_apart_as_in_stock_vllm(model_dirs, case) -> None:
    first, second, shared = CASES[case]
    second = {k: v() if callable(v) else v for k, v in second.items()}  # after vLLM's init
    stock = _hits_after(model_dirs, "legacy", first, second)
    relay = _hits_after(model_dirs, "per-group", first, second)
    assert (stock > 0) is shared, stock  # the reference: stock vLLM 0.33
    assert (relay > 0) is shared, relay


def test_the_salt_covers_every_extra_and_the_client_salt() -> None:
    plain = _req("p", cache_salt="t1")
    assert request_salt(plain) == "t1"  # no extras: relaykv's own keys, as a P/D peer's
    assert request_salt(_req("n")) is None
    with_lora = request_salt(_req("l", lora_request=_lora("x"), cache_salt="t1"))
    assert with_lora not in (None, "t1")
    assert request_salt(_req("l2", lora_request=_lora("x"), cache_salt="t2")) != with_lora
    # The derived salt depends on the client's salt: reaching tenant t1's LoRA blocks with a
    # plain request needs `with_lora`, which needs t1 (and t1 alone already grants them).
    forged = _req("f", lora_request=_lora("x"), cache_salt=with_lora)
    assert request_salt(forged) != with_lora
    # An unsalted LoRA request's salt is computable from the adapter alone; a plain request
    # sending it as its `cache_salt` (vLLM's Python API takes any string) does not get it:
    # it would read, or fill, the adapter's blocks with the base model's KV.
    unsalted_lora = request_salt(_req("u", lora_request=_lora("x")))
    assert unsalted_lora is not None
    posing = request_salt(_req("q", cache_salt=unsalted_lora))
    assert posing not in (None, unsalted_lora, with_lora)
    assert request_salt(_req("q2", cache_salt=posing)) != posing
    # an empty salt is no salt, as in vLLM's hash
    assert request_salt(_req("z", lora_request=_lora("x"), cache_salt="")) == unsalted_lora
    embeds = torch.zeros(len(PROMPT), 4)
    a = request_salt(_req("e1", prompt_embeds=embeds))
    b = request_salt(_req("e2", prompt_embeds=embeds + 1))
    assert a is not None and b is not None and a != b
