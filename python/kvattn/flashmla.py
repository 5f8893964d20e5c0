"""FlashMLA's get_mla_metadata / flash_mla_with_kvcache over kvattn's MLA pools.

The metadata is kvattn's split-KV schedule in FlashMLA's format:
tile_scheduler_metadata [num_workers, 8] int32 rows (begin_req, begin_pos,
end_req, end_pos, begin_split, 0, 0, 0) and num_splits [batch + 1] int32 (the
prefix sum of each request's chunks). kvattn's MLA workers walk the requests
longest first (the plan's sched_order), so begin_req and end_req are positions
in that order, not request indices: read the rows as kvattn's own, as FlashMLA's
callers do (they only pass them back). flash_mla_with_kvcache checks their shape
and uses the schedule of its own plan, which is the same for the same lengths.
"""
import numpy as np

from . import _arrays as A
from . import _cache
from .core import LAYOUT_MLA, MLA_HEAD_DIM, MLA_V_DIM, Context, Pool, attn_params

_META_PAGE = 64
_meta_pools = {}  # per device: a one-page MLA pool that plans only schedules


def _lens(cache_seqlens):
    seq = A.host_int32(cache_seqlens, "cache_seqlens").ravel()
    if len(seq) == 0 or np.any(seq < 1):
        raise ValueError("cache_seqlens: expected [batch] lengths >= 1")
    return seq


def _device_of(x):
    return A.view(x, "cache_seqlens").device if not isinstance(x, (list, tuple)) else "cpu"


def get_mla_metadata(cache_seqlens, num_heads_per_head_k, num_heads_k, num_heads_q=None,
                     is_fp8_kvcache=False, topk=None):
    """(tile_scheduler_metadata [num_workers, 8] int32, num_splits [batch + 1] int32), on the
    device of cache_seqlens. The schedule depends only on the lengths and the worker count."""
    meta, splits, _order = _schedule(cache_seqlens, num_heads_per_head_k, num_heads_k, topk)
    return meta, splits


def _schedule(cache_seqlens, num_heads_per_head_k, num_heads_k, topk=None):
    """get_mla_metadata's pair and the order its rows walk (numpy int32 [batch])."""
    if topk is not None:
        raise ValueError("topk (sparse attention): not supported by kvattn")
    if num_heads_k != 1:
        raise ValueError(f"num_heads_k {num_heads_k}: kvattn's MLA has one latent head")
    if num_heads_per_head_k < 1:
        raise ValueError("num_heads_per_head_k must be >= 1")
    seq = _lens(cache_seqlens)
    dev = _device_of(cache_seqlens)
    pool = _meta_pools.get(dev)
    if pool is None:
        pool = _meta_pools[dev] = Pool(Context.get(dev), num_layers=1, num_pages=1,
                                       page_size=_META_PAGE, num_kv_heads=1, head_dim=MLA_HEAD_DIM,
                                       kv_dtype="bf16", layout=LAYOUT_MLA)
    stride = int((seq.max() + _META_PAGE - 1) // _META_PAGE)
    # workers as for a run with these heads (exact for s_q = 1)
    plan = _cache.paged_plan(pool, num_qo_heads=int(num_heads_per_head_k), batch=len(seq),
                             q_tokens=len(seq), pages_per_req=stride)
    plan.update_paged(np.ones(len(seq), np.int32), seq, np.zeros((len(seq), stride), np.int32))
    info = plan.info()
    meta, splits = _metadata_from_info(info, cache_seqlens)
    return meta, splits, info["sched_order"]


def _metadata_from_info(info, like):
    meta = np.zeros((info["num_workers"], 8), np.int32)
    meta[:, :5] = info["split_schedule"]
    splits = info["split_indptr"].astype(np.int32)
    if A.is_torch(like):
        import torch
        return (torch.from_numpy(meta).to(like.device), torch.from_numpy(splits).to(like.device))
    return meta, splits


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                           tile_scheduler_metadata, num_splits, softmax_scale=None, causal=False,
                           descale_q=None, descale_k=None, is_fp8_kvcache=False, indices=None):
    """(out [b, s_q, h_q, 512], softmax_lse [b, h_q, s_q] f32). q [b, s_q, h_q, 576];
    k_cache [num_pages, page_size, 1, 576] (f16/bf16; fp8 e4m3 with a scalar descale_k);
    block_table [b, max_pages] int32; cache_seqlens [b] (KV length including the s_q new
    tokens, whose latents the caller stored). s_q must be 1..8 (kvattn's MLA is decode)."""
    if indices is not None:
        raise ValueError("indices (sparse attention): not supported by kvattn")
    if descale_q is not None:
        raise ValueError("descale_q: kvattn takes f32/f16/bf16 queries, no fp8 query")
    if head_dim_v != MLA_V_DIM:
        raise ValueError(f"head_dim_v {head_dim_v}: kvattn's MLA has V = the latent's first 512")
    qa = A.require(A.view(q, "q"), "q", dtypes=(A.F32, A.F16, A.BF16), ndim=4)
    b, sq, hq, dq = qa.shape
    if dq != MLA_HEAD_DIM:
        raise ValueError(f"q: head dim {dq}, expected 576")
    if not 1 <= sq <= 8:
        raise ValueError(f"q: s_q {sq}: kvattn's MLA runs decode steps of 1..8 tokens")
    ka = A.require(A.view(k_cache, "k_cache"), "k_cache", dtypes=(A.F16, A.BF16, A.FP8), ndim=4)
    if ka.shape[2] != 1 or ka.shape[3] != MLA_HEAD_DIM:
        raise ValueError(f"k_cache: expected [num_pages, page_size, 1, 576], got {list(ka.shape)}")
    A.same_device([qa, ka])
    seq = _lens(cache_seqlens)
    pt = A.host_int32(block_table, "block_table")
    if pt.ndim != 2 or pt.shape[0] != b or len(seq) != b:
        raise ValueError(f"block_table {list(pt.shape)} / cache_seqlens [{len(seq)}]: expected "
                         f"batch {b}")
    if np.any(seq < sq):
        raise ValueError("cache_seqlens: each length counts the s_q new tokens (>= s_q)")
    meta = A.view(tile_scheduler_metadata, "tile_scheduler_metadata")
    nsp = A.view(num_splits, "num_splits")
    if meta.ndim != 2 or meta.shape[1] != 8 or meta.dtype != "i32":
        raise ValueError("tile_scheduler_metadata: expected [num_sm_parts, 8] int32")
    if nsp.shape != (b + 1,) or nsp.dtype != "i32":
        raise ValueError(f"num_splits: expected [{b + 1}] int32")
    num_pages, ps = ka.shape[0], ka.shape[1]
    pool = _cache.external_pool(ka, None, page_size=ps, pages_view_shape=(num_pages, ps, 1, MLA_HEAD_DIM),
                                layout=LAYOUT_MLA)
    if ka.dtype == A.FP8:
        ds = 1.0 if descale_k is None else _scalar(descale_k, "descale_k")
        pool.set_scale(0, ds, 1.0)
    elif descale_k is not None:
        raise ValueError("descale_k: for fp8 caches only")
    stride = int((seq.max() + ps - 1) // ps)
    if stride > pt.shape[1]:
        raise ValueError("block_table has fewer pages than cache_seqlens needs")
    plan = _cache.paged_plan(pool, num_qo_heads=hq, batch=b, q_tokens=b * sq, pages_per_req=stride)
    plan.update_paged(np.full(b, sq, np.int32), seq, np.ascontiguousarray(pt[:, :stride]))
    out = A.empty_like_kind(qa, (b, sq, hq, MLA_V_DIM), qa.dtype)
    lse = A.empty_like_kind(qa, (b * sq, hq), A.F32)
    plan.attention(0, A.reshape(qa, (b * sq, hq, MLA_HEAD_DIM)),
                   A.reshape(A.view(out, "out"), (b * sq, hq, MLA_V_DIM)), lse,
                   params=attn_params(softmax_scale, bool(causal)), pool=pool)
    lse = lse.reshape(b, sq, hq)
    lse = lse.transpose(1, 2).contiguous() if A.is_torch(lse) else np.ascontiguousarray(lse.transpose(0, 2, 1))
    return out, lse


def _scalar(x, name):
    vals = np.asarray(x.detach().float().cpu().numpy() if A.is_torch(x) else x, np.float64).ravel()
    if vals.size == 0 or np.any(vals != vals[0]) or not vals[0] > 0:
        raise ValueError(f"{name}: kvattn takes one positive scale per layer (a scalar or uniform)")
    return float(vals[0])

