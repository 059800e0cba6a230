"""relaykv.model: target models, paged KV, EAGLE draft, the model runner (docs/model.md).

May import torch and `relaykv.kvcache` geometry only (docs/architecture.md).
"""

from __future__ import annotations

from relaykv.common.messages.steps import (
    GREEDY,
    SamplingParams,
    SequenceOutput,
    SequenceWork,
    SpeculativeStats,
    StepBatch,
    StepOutput,
    TokenLogprobs,
)
from relaykv.model.config import ModelConfig, from_hf_dict, to_hf_dict
from relaykv.model.drafts import NoDefaultDraft, default_draft, has_default_draft
from relaykv.model.eagle import (
    EagleDraft,
    load_eagle_checkpoint,
    random_draft,
    save_eagle_checkpoint,
)
from relaykv.model.kv_layout import DraftAttention, KVLayout, derive_layout, geometry_from_config
from relaykv.model.kv_pages import KVPageStore
from relaykv.model.loading import LoadedModel, PackageNotInstalled, is_installed, load_model
from relaykv.model.runner import ModelRunner
from relaykv.model.transformer import CausalLM

__all__ = [
    "GREEDY",
    "CausalLM",
    "DraftAttention",
    "EagleDraft",
    "KVLayout",
    "KVPageStore",
    "LoadedModel",
    "ModelConfig",
    "ModelRunner",
    "NoDefaultDraft",
    "PackageNotInstalled",
    "SamplingParams",
    "SequenceOutput",
    "SequenceWork",
    "SpeculativeStats",
    "StepBatch",
    "StepOutput",
    "TokenLogprobs",
    "default_draft",
    "derive_layout",
    "from_hf_dict",
    "geometry_from_config",
    "has_default_draft",
    "is_installed",
    "load_eagle_checkpoint",
    "load_model",
    "random_draft",
    "save_eagle_checkpoint",
    "to_hf_dict",
]
