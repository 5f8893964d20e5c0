"""kvattn for Python: ctypes bindings over libkvattn (no compiled extension).

Drop-in APIs: flash_attn_with_kvcache (FlashAttention-3), BatchDecode/Prefill
WithPagedKVCacheWrapper and merge_state (FlashInfer), get_mla_metadata and
flash_mla_with_kvcache (FlashMLA); the core objects (Context, Pool, ReqTable,
Plan, GraphState) and KvattnAttnBackend (SGLang's attention-backend shape).
"""
from ._lib import KvattnError, api as _api
from .core import (LAYOUT_MHA, LAYOUT_MLA, Context, GraphState, Plan, Pool, ReqTable,
                   attn_params, device_available)
from .backend import KvattnAttnBackend
from .fa3 import flash_attn_with_kvcache
from .flashmla import flash_mla_with_kvcache, get_mla_metadata
from .flashinfer import (BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper,
                         merge_state, merge_state_in_place)

__version__ = "0.1.0"
library_path = _api.path

__all__ = ["KvattnError", "Context", "Pool", "ReqTable", "Plan", "GraphState", "attn_params",
           "device_available", "LAYOUT_MHA", "LAYOUT_MLA", "flash_attn_with_kvcache",
           "BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper",
           "merge_state", "merge_state_in_place", "get_mla_metadata", "flash_mla_with_kvcache",
           "KvattnAttnBackend", "library_path"]
