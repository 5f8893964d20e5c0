"""FlashAttention-3's flash_attn_with_kvcache (hopper/flash_attn_interface.py) over kvattn.

Index arrays (cache_seqlens, page_table, cu_seqlens_*) are read on the host:
for CUDA tensors that is a device-to-host copy, which synchronizes. The
SGLang-shaped backend (kvattn.backend) plans once per step and avoids it.
"""
import numpy as np

from . import _arrays as A
from . import _cache
from .core import attn_params


def _scale_of(x, name):
    """kvattn has one K and one V scale per layer: accept a scalar or a uniform array."""
    if x is None:
        return 1.0
    if isinstance(x, (int, float)):
        return float(x)
    if A.is_torch(x):
        vals = x.detach().float().cpu().numpy()
    else:
        vals = np.asarray(x, dtype=np.float64)
    if vals.size == 0:
        raise ValueError(f"{name}: empty")
    if not np.all(vals == vals.flat[0]):
        raise ValueError(f"{name}: kvattn has one scale per layer; a per-(batch, kv_head) "
                         "descale must be uniform")
    if not vals.flat[0] > 0:
        raise ValueError(f"{name}: scale must be > 0")
    return float(vals.flat[0])


def _unsupported(**kw):
    for name, (value, default) in kw.items():
        if value is not default and (default is None or value != default):
            raise ValueError(f"flash_attn_with_kvcache: {name} is not supported by kvattn "
                             "(see docs/python/support.md)")


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, page_table=None, cu_seqlens_q=None,
                            cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                            q_descale=None, k_descale=None, v_descale=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), attention_chunk=0, softcap=0.0,
                            rotary_interleaved=True, scheduler_metadata=None, num_splits=0,
                            pack_gqa=None, sm_margin=0, return_softmax_lse=False):
    """out [like q] (and softmax_lse [batch, nheads, seqlen_q] / [nheads, total_q] f32).

    q [batch, seqlen_q, nheads, d] or [total_q, nheads, d] with cu_seqlens_q.
    k_cache/v_cache [num_pages, page_size, nheads_k, d] with page_table [batch, max_pages]
    int32, or [batch, seqlen_cache, nheads_k, d] without. cache_seqlens: int or [batch]:
    tokens in the cache before k/v are appended. k/v: new tokens ([batch, seqlen_new, nheads_k,
    d] or [total_new, nheads_k, d] with cu_seqlens_k_new) stored at cache_seqlens before
    attending; kvattn needs seqlen_new == seqlen_q per request."""
    _unsupported(qv=(qv, None), rotary_cos=(rotary_cos, None), rotary_sin=(rotary_sin, None),
                 cache_batch_idx=(cache_batch_idx, None), cache_leftpad=(cache_leftpad, None),
                 rotary_seqlens=(rotary_seqlens, None), q_descale=(q_descale, None),
                 attention_chunk=(attention_chunk, 0))
    # scheduler_metadata, num_splits, pack_gqa, sm_margin: FA3 tuning hints, ignored.
    qa = A.view(q, "q")
    ka, va = A.view(k_cache, "k_cache"), A.view(v_cache, "v_cache")
    A.require(qa, "q", dtypes=(A.F32, A.F16, A.BF16), ndim=(3, 4))
    for a, n in ((ka, "k_cache"), (va, "v_cache")):
        A.require(a, n, dtypes=(A.F16, A.BF16, A.FP8), ndim=4)
    if va.shape != ka.shape or va.dtype != ka.dtype:
        raise ValueError(f"v_cache {list(va.shape)} differs from k_cache {list(ka.shape)} "
                         "(kvattn needs head_dim_v == head_dim and one dtype)")
    device = A.same_device([qa, ka, va])
    hk, d = ka.shape[2], ka.shape[3]
    varlen = cu_seqlens_q is not None
    if varlen:
        if qa.ndim != 3:
            raise ValueError(f"q: with cu_seqlens_q expected [total_q, nheads, d], got {list(qa.shape)}")
        cu_q = A.host_int32(cu_seqlens_q, "cu_seqlens_q")
        if cu_q.ndim != 1 or len(cu_q) < 2 or cu_q[0] != 0 or np.any(np.diff(cu_q) < 0) \
                or cu_q[-1] > qa.shape[0]:
            raise ValueError("cu_seqlens_q: must be [batch + 1], from 0, non-decreasing, "
                             f"<= total_q = {qa.shape[0]}")
        batch = len(cu_q) - 1
        q_lens = np.diff(cu_q)
    else:
        if qa.ndim != 4:
            raise ValueError(f"q: expected [batch, seqlen_q, nheads, d], got {list(qa.shape)}")
        batch, sq = qa.shape[0], qa.shape[1]
        q_lens = np.full(batch, sq, np.int32)
        cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    hq = qa.shape[-2]
    if qa.shape[-1] != d:
        raise ValueError(f"q head_dim {qa.shape[-1]} != k_cache head_dim {d}")
    if hq % hk:
        raise ValueError(f"nheads {hq} is not a multiple of nheads_k {hk}")

    # the cache as pages
    if page_table is not None:
        pt = A.host_int32(page_table, "page_table")
        if pt.ndim != 2 or pt.shape[0] != batch:
            raise ValueError(f"page_table: expected [batch={batch}, max_pages], got {list(pt.shape)}")
        num_pages, ps = ka.shape[0], ka.shape[1]
        cache_cap = pt.shape[1] * ps
    else:
        if ka.shape[0] < batch:
            raise ValueError(f"k_cache: batch {ka.shape[0]} < q batch {batch}")
        seqlen_cache = ka.shape[1]
        ps = max(p for p in range(1, min(seqlen_cache, 256) + 1) if seqlen_cache % p == 0)
        per = seqlen_cache // ps
        num_pages = ka.shape[0] * per
        pt = (np.arange(batch, dtype=np.int32)[:, None] * per
              + np.arange(per, dtype=np.int32)[None, :]).astype(np.int32)
        cache_cap = seqlen_cache

    if cache_seqlens is None:
        seqlens = np.full(batch, cache_cap, np.int32)
    elif isinstance(cache_seqlens, int):
        seqlens = np.full(batch, cache_seqlens, np.int32)
    else:
        seqlens = A.host_int32(cache_seqlens, "cache_seqlens").ravel()
        if len(seqlens) != batch:
            raise ValueError(f"cache_seqlens: expected [{batch}], got [{len(seqlens)}]")
    if np.any(seqlens < 0):
        raise ValueError("cache_seqlens: negative length")

    # new K/V appended at cache_seqlens
    new_k = new_v = None
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together")
    if k is not None:
        nk, nv = A.view(k, "k"), A.view(v, "v")
        for a, n in ((nk, "k"), (nv, "v")):
            A.require(a, n, dtypes=(A.F32, A.F16, A.BF16), device=device)
        if nk.shape != nv.shape or nk.dtype != nv.dtype:
            raise ValueError("k and v differ in shape or dtype")
        if cu_seqlens_k_new is not None:
            A.require(nk, "k", ndim=3, shape=(None, hk, d))
            kn_lens = np.diff(A.host_int32(cu_seqlens_k_new, "cu_seqlens_k_new"))
        else:
            A.require(nk, "k", ndim=4, shape=(batch, None, hk, d))
            kn_lens = np.full(batch, nk.shape[1], np.int32)
        if len(kn_lens) != batch or np.any(kn_lens != q_lens):
            raise ValueError("kvattn stores as many new K/V tokens per request as it has query "
                             f"tokens: k/v lengths {kn_lens.tolist()} vs q lengths {q_lens.tolist()}")
        new_k, new_v = nk, nv
        total_k = seqlens + q_lens
    else:
        total_k = seqlens
    if np.any(total_k > cache_cap):
        raise ValueError(f"cache_seqlens (+ new tokens) exceed the cache ({cache_cap} tokens)")
    if np.any(q_lens > total_k):
        raise ValueError("a request has more query tokens than keys (seqlen_q > seqlen_k)")

    left, right = window_size
    if right not in (-1, 0) and not (causal and right >= 0):
        raise ValueError(f"window_size right={right}: kvattn supports only -1 (or 0 = causal)")
    is_causal = bool(causal) or right == 0
    params = attn_params(softmax_scale, is_causal, left if left >= 0 else -1, softcap or 0.0)

    # requests with no query tokens are left out of the plan (kvattn needs >= 1)
    live = np.nonzero(q_lens > 0)[0]
    total_q = int(cu_q[-1])
    out = A.empty_like_kind(qa, qa.shape, qa.dtype)
    lse = None
    if return_softmax_lse:
        lse = A.empty_like_kind(qa, (max(total_q, qa.shape[0] if varlen else total_q), hq), A.F32)
    if len(live) == 0:
        return _finish(out, lse, qa, varlen, batch, hq, q_lens)
    if k is not None and len(live) != batch:
        raise ValueError("k/v with an empty request: kvattn needs >= 1 new token per request")

    pool = _cache.external_pool(ka, va, page_size=ps, pages_view_shape=(num_pages, ps, hk, d))
    ks, vs = _scale_of(k_descale, "k_descale"), _scale_of(v_descale, "v_descale")
    if ka.dtype == A.FP8:
        pool.set_scale(0, ks, vs)
    elif k_descale is not None or v_descale is not None:
        if ks != 1.0 or vs != 1.0:
            raise ValueError("k_descale/v_descale apply to fp8 caches only")
    pages_needed = int(((total_k[live] + ps - 1) // ps).max())
    stride = max(pages_needed, 1)
    plan = _cache.paged_plan(pool, num_qo_heads=hq, batch=len(live), q_tokens=total_q,
                             pages_per_req=stride)
    plan.update_paged(q_lens[live], total_k[live], np.ascontiguousarray(pt[live, :stride]))
    q_rows = A.head_rows(A.reshape(qa, (-1, hq, d)), total_q)
    o_rows = A.head_rows(A.reshape(A.view(out, "out"), (-1, hq, d)), total_q)
    if new_k is not None:
        plan.store_kv(0, A.head_rows(A.reshape(new_k, (-1, hk, d)), total_q),
                      A.head_rows(A.reshape(new_v, (-1, hk, d)), total_q), pool=pool)
    # rows of empty requests are empty, so the live requests' rows are rows [0, total_q)
    lse_rows = None if lse is None else A.head_rows(A.view(lse, "lse"), total_q)
    plan.attention(0, q_rows, o_rows, lse_rows, params=params, pool=pool)
    return _finish(out, lse, qa, varlen, batch, hq, q_lens)


def _finish(out, lse, qa, varlen, batch, hq, q_lens):
    if lse is None:
        return out
    # kvattn's LSE is [total_q, nheads]; FA3's [batch, nheads, seqlen_q] or [nheads, total_q]
    if varlen:
        lse_fa = lse.T
    else:
        lse_fa = lse.reshape(batch, int(q_lens[0]) if batch else 0, hq).transpose(1, 2) \
            if A.is_torch(lse) else lse.reshape(batch, int(q_lens[0]) if batch else 0, hq).transpose(0, 2, 1)
    lse_fa = lse_fa.contiguous() if A.is_torch(lse_fa) else np.ascontiguousarray(lse_fa)
    return out, lse_fa

