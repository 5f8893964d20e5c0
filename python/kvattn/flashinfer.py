"""FlashInfer's paged-KV wrappers and merge_state over kvattn.

LSE follows FlashInfer: base 2 (log2 of the sum of 2^(logit * log2 e)), so
lse_flashinfer = lse_natural / ln 2; merge_state takes and returns base 2.
plan() reads its index arrays on the host (FlashInfer does too).
"""
import ctypes
import itertools
import math

import numpy as np

from . import _arrays as A
from . import _cache
from ._lib import api, check
from .core import Context, attn_params, kv_dtype_code

LN2 = math.log(2.0)
_plan_ids = itertools.count(1)  # unique per plan() call, across wrappers


def _paged_cache(paged_kv_cache, kv_layout):
    """(k view, v view, pages_view_shape, page id multiplier, v byte offset) for a
    (k_cache, v_cache) tuple or one [num_pages, 2, page_size, heads, dim] tensor."""
    if kv_layout != "NHD":
        raise ValueError(f"kv_layout {kv_layout!r}: kvattn supports NHD only")
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise ValueError("paged_kv_cache: expected (k_cache, v_cache)")
        ka, va = A.view(paged_kv_cache[0], "k_cache"), A.view(paged_kv_cache[1], "v_cache")
        for a, n in ((ka, "k_cache"), (va, "v_cache")):
            A.require(a, n, dtypes=(A.F16, A.BF16, A.FP8), ndim=4)
        if ka.shape != va.shape or ka.dtype != va.dtype:
            raise ValueError("k_cache and v_cache differ in shape or dtype")
        return ka, va, tuple(ka.shape), 1, 0
    kv = A.require(A.view(paged_kv_cache, "paged_kv_cache"), "paged_kv_cache",
                   dtypes=(A.F16, A.BF16, A.FP8), ndim=5)
    if kv.shape[1] != 2:
        raise ValueError(f"paged_kv_cache: expected [num_pages, 2, page_size, heads, dim], got "
                         f"{list(kv.shape)}")
    # K and V pages interleave: seen as a pool of 2N pages whose K page 2p is
    # page p's K and whose V buffer starts one page later, page ids doubled.
    n, _, ps, h, d = kv.shape
    item = 1 if kv.dtype == A.FP8 else 2
    return kv, kv, (2 * n, ps, h, d), 2, ps * h * d * item


class _PagedWrapper:
    def __init__(self, float_workspace_buffer=None, kv_layout="NHD", use_cuda_graph=False, **_bufs):
        if kv_layout != "NHD":
            raise ValueError(f"kv_layout {kv_layout!r}: kvattn supports NHD only")
        if use_cuda_graph:
            raise ValueError("use_cuda_graph: these wrappers re-plan on the host; for CUDA graphs "
                             "use kvattn.KvattnAttnBackend (kvattn.GraphState)")
        # the workspace is accepted for signature compatibility: kvattn plans own theirs
        self._workspace = float_workspace_buffer
        self._kv_layout = kv_layout
        self._planned = None
        self._generation = 0

    def _set_plan(self, q_lens, kv_indptr, kv_indices, kv_last_page_len, num_qo_heads,
                  num_kv_heads, head_dim, page_size, causal, window_left, logits_soft_cap,
                  sm_scale):
        indptr = A.host_int32(kv_indptr, "indptr").ravel()
        indices = A.host_int32(kv_indices, "indices").ravel()
        last = A.host_int32(kv_last_page_len, "last_page_len").ravel()
        batch = len(indptr) - 1
        if batch < 0 or len(last) != batch or len(q_lens) != batch:
            raise ValueError(f"indptr [{len(indptr)}], last_page_len [{len(last)}] and the "
                             f"query lengths [{len(q_lens)}] do not describe one batch")
        if indptr[0] != 0 or np.any(np.diff(indptr) < 0) or indptr[-1] > len(indices):
            raise ValueError("indptr: must start at 0, not decrease and end <= len(indices)")
        if not 1 <= page_size <= 256:
            raise ValueError(f"page_size {page_size}: kvattn supports 1..256")
        if num_qo_heads % num_kv_heads:
            raise ValueError(f"num_qo_heads {num_qo_heads} not a multiple of num_kv_heads "
                             f"{num_kv_heads}")
        npages = np.diff(indptr)
        if np.any((last < 1) & (npages > 0)) or np.any(last > page_size):
            raise ValueError("last_page_len: must be in [1, page_size]")
        kv_lens = np.where(npages > 0, (npages - 1) * page_size + last, 0).astype(np.int32)
        if np.any(q_lens > kv_lens):
            raise ValueError("a request has more query tokens than KV tokens")
        live = np.nonzero(q_lens > 0)[0]
        stride = max(int(npages.max()) if batch else 1, 1)
        table = np.zeros((batch, stride), np.int32)
        for r in range(batch):
            table[r, :npages[r]] = indices[indptr[r]:indptr[r + 1]]
        self._generation = next(_plan_ids)
        self._planned = dict(q_lens=q_lens, kv_lens=kv_lens, table=table, live=live,
                             hq=num_qo_heads, hk=num_kv_heads, d=head_dim, ps=page_size,
                             total_q=int(q_lens.sum()),
                             params=attn_params(sm_scale, causal, window_left, logits_soft_cap))

    def _run(self, q, paged_kv_cache, k_scale, v_scale, out, lse, return_lse, window_left):
        p = self._planned
        if p is None:
            raise ValueError("run() before plan()")
        ka, va, shape, id_mul, v_off = _paged_cache(paged_kv_cache, self._kv_layout)
        if shape[1:] != (p["ps"], p["hk"], p["d"]):
            raise ValueError(f"paged_kv_cache pages {list(shape[1:])} differ from the plan's "
                             f"[page_size={p['ps']}, num_kv_heads={p['hk']}, head_dim={p['d']}]")
        qa = A.require(A.view(q, "q"), "q", dtypes=(A.F32, A.F16, A.BF16),
                       shape=(p["total_q"], p["hq"], p["d"]))
        A.same_device([qa, ka, va])
        pool = _cache.external_pool(ka, va, page_size=p["ps"], pages_view_shape=shape,
                                    v_offset_bytes=v_off, page_ids_scale=id_mul)
        fp8 = ka.dtype == A.FP8
        ks = 1.0 if k_scale is None else float(k_scale)
        vs = 1.0 if v_scale is None else float(v_scale)
        if fp8:
            pool.set_scale(0, ks, vs)
        elif ks != 1.0 or vs != 1.0:
            raise ValueError("k_scale/v_scale: kvattn applies them to fp8 caches only")
        params = p["params"]
        if window_left is not None:
            params = attn_params(params.sm_scale or None, bool(params.causal), window_left,
                                 params.logit_softcap)
        if out is None:
            out = A.empty_like_kind(qa, qa.shape, qa.dtype)
        A.require(A.view(out, "out"), "out", dtypes=(qa.dtype,), shape=qa.shape, device=qa.device)
        if lse is None and return_lse:
            lse = A.empty_like_kind(qa, qa.shape[:2], A.F32)
        if lse is not None:
            A.require(A.view(lse, "lse"), "lse", dtypes=(A.F32,), shape=qa.shape[:2],
                      device=qa.device)
        live = p["live"]
        if len(live):
            plan = _cache.paged_plan(pool, num_qo_heads=p["hq"], batch=len(live),
                                     q_tokens=p["total_q"], pages_per_req=p["table"].shape[1])
            token = self._generation
            if getattr(plan, "_batch_token", None) != token:
                plan.update_paged(p["q_lens"][live], p["kv_lens"][live],
                                  np.ascontiguousarray(p["table"][live] * id_mul))
                plan._batch_token = token
            plan.attention(0, q, out, lse, params=params, pool=pool)
        if lse is None:
            return out
        lse *= 1.0 / LN2  # natural -> base 2 (FlashInfer's convention)
        return out, lse

    def run_return_lse(self, q, paged_kv_cache, *args, **kw):
        kw["return_lse"] = True
        return self.run(q, paged_kv_cache, *args, **kw)

    forward = None  # FlashInfer's deprecated alias is not provided
    end_forward = lambda self: None  # noqa: E731  (FlashInfer compatibility no-op)


def _check_unsupported(pos_encoding_mode, rope_scale, rope_theta, extra):
    if pos_encoding_mode not in ("NONE", None):
        raise ValueError(f"pos_encoding_mode {pos_encoding_mode!r}: kvattn applies no RoPE "
                         "(apply it before storing K)")
    if rope_scale is not None or rope_theta is not None:
        raise ValueError("rope_scale/rope_theta: not supported (no RoPE in kvattn)")
    for name, value in extra.items():
        if value is not None and value is not False:
            raise ValueError(f"{name}: not supported by kvattn")


class BatchDecodeWithPagedKVCacheWrapper(_PagedWrapper):
    """One query token per request over a paged KV cache (NHD)."""

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
             page_size, pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None,
             q_data_type="float16", kv_data_type=None, data_type=None, sm_scale=None,
             rope_scale=None, rope_theta=None, non_blocking=True, **unsupported):
        _check_unsupported(pos_encoding_mode, rope_scale, rope_theta, unsupported)
        for dt in (q_data_type, kv_data_type, data_type):
            if dt is not None:
                kv_dtype_code(dt)  # TypeError on an unknown dtype
        batch = len(A.host_int32(indptr, "indptr").ravel()) - 1
        self._set_plan(np.ones(max(batch, 0), np.int32), indptr, indices, last_page_len,
                       num_qo_heads, num_kv_heads, head_dim, page_size, True, window_left,
                       logits_soft_cap, sm_scale)

    begin_forward = plan

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None,
            lse=None, return_lse=False, enable_pdl=None, window_left=None, sinks=None):
        if q_scale is not None or sinks is not None:
            raise ValueError("q_scale/sinks: not supported by kvattn")
        return self._run(q, paged_kv_cache, k_scale, v_scale, out, lse, return_lse, window_left)


class BatchPrefillWithPagedKVCacheWrapper(_PagedWrapper):
    """Queries of qo_indptr over a paged KV cache (NHD); causal aligns to the end."""

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
             num_qo_heads, num_kv_heads, head_dim_qk, page_size, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None,
             rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
             non_blocking=True, **unsupported):
        if head_dim_vo not in (None, head_dim_qk):
            raise ValueError("head_dim_vo != head_dim_qk: not supported by kvattn (MHA pools)")
        _check_unsupported(pos_encoding_mode, rope_scale, rope_theta,
                           dict(custom_mask=custom_mask, packed_custom_mask=packed_custom_mask,
                                **unsupported))
        for dt in (q_data_type, kv_data_type):
            if dt is not None:
                kv_dtype_code(dt)
        qo = A.host_int32(qo_indptr, "qo_indptr").ravel()
        if len(qo) < 1 or qo[0] != 0 or np.any(np.diff(qo) < 0):
            raise ValueError("qo_indptr: must start at 0 and not decrease")
        self._set_plan(np.diff(qo).astype(np.int32), paged_kv_indptr, paged_kv_indices,
                       paged_kv_last_page_len, num_qo_heads, num_kv_heads, head_dim_qk, page_size,
                       causal, window_left, logits_soft_cap, sm_scale)

    begin_forward = plan

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None,
            lse=None, return_lse=False, enable_pdl=None, window_left=None, sinks=None):
        if q_scale is not None or sinks is not None:
            raise ValueError("q_scale/sinks: not supported by kvattn")
        return self._run(q, paged_kv_cache, k_scale, v_scale, out, lse, return_lse, window_left)


def merge_state(v_a, s_a, v_b, s_b):
    """Merges two attention states over disjoint keys: v [tokens, heads, dim] (f32/f16/bf16),
    s [tokens, heads] float32 base-2 LSE. Returns (v, s)."""
    va, vb = A.view(v_a, "v_a"), A.view(v_b, "v_b")
    A.require(va, "v_a", dtypes=(A.F32, A.F16, A.BF16), ndim=3)
    A.require(vb, "v_b", dtypes=(va.dtype,), shape=va.shape)
    sa = A.require(A.view(s_a, "s_a"), "s_a", dtypes=(A.F32,), shape=va.shape[:2])
    sb = A.require(A.view(s_b, "s_b"), "s_b", dtypes=(A.F32,), shape=va.shape[:2])
    dev = A.same_device([va, vb, sa, sb])
    n, h, d = va.shape
    v_out = A.empty_like_kind(va, va.shape, va.dtype)
    s_out = A.empty_like_kind(va, va.shape[:2], A.F32)
    sa_e, sb_e = s_a * LN2, s_b * LN2  # kvattn's LSE is natural
    ctx = Context.get(dev)
    ctx.use_current_stream()
    check(api.kva_merge_states(ctx.handle, n, h, d, va.dtype, ctypes.c_void_p(va.ptr),
                               ctypes.c_void_p(A.view(sa_e, "s_a").ptr), ctypes.c_void_p(vb.ptr),
                               ctypes.c_void_p(A.view(sb_e, "s_b").ptr),
                               ctypes.c_void_p(A.view(v_out, "v").ptr),
                               ctypes.c_void_p(A.view(s_out, "s").ptr)))
    s_out *= 1.0 / LN2
    return v_out, s_out


def merge_state_in_place(v, s, v_other, s_other, mask=None):
    """v, s <- merge((v, s), (v_other, s_other)) (FlashInfer's in-place form; no mask)."""
    if mask is not None:
        raise ValueError("mask: not supported by kvattn")
    vm, sm = merge_state(v, s, v_other, s_other)
    if A.is_torch(v):
        v.copy_(vm)
        s.copy_(sm)
    else:
        v[...] = vm
        s[...] = sm
