"""The core objects as Python classes: Context, Pool, ReqTable, Plan, GraphState.

Every object keeps its parent alive (a plan holds its pool, a pool its context),
so the C ownership rules hold however Python collects them.
"""
import ctypes
import sys

from . import _arrays as A
from ._lib import (AttnParams, Batch, ContextConfig, GraphConfig, PagedBatch, PlanConfig,
                   PlanInfo, PoolConfig, alive, api, check)

LAYOUT_MHA, LAYOUT_MLA = 0, 1
MLA_HEAD_DIM, MLA_V_DIM = 576, 512
_DT_ARGS = {"float32": A.F32, "f32": A.F32, "float16": A.F16, "f16": A.F16, "half": A.F16,
            "bfloat16": A.BF16, "bf16": A.BF16, "fp8": A.FP8, "float8_e4m3fn": A.FP8,
            "e4m3": A.FP8}


def kv_dtype_code(dtype):
    """'float16' / 'bf16' / 'fp8' / torch.float16 / numpy.float16 / kva code -> kva_dtype."""
    if isinstance(dtype, int):
        return dtype
    name = str(dtype).replace("torch.", "").replace("<class 'numpy.", "").rstrip("'>")
    if name not in _DT_ARGS:
        raise TypeError(f"unknown dtype {dtype!r}")
    return _DT_ARGS[name]


class Context:
    """A device and its backend. Use Context.get(device) for the cached one per device."""
    _cache = {}

    def __init__(self, device="cpu", num_threads=0):
        dev = _parse_device(device)
        cfg = ContextConfig(0 if dev == "cpu" else 1, num_threads,
                            0 if dev == "cpu" else dev[1])
        h = ctypes.c_void_p()
        check(api.kva_context_create(ctypes.byref(cfg), ctypes.byref(h)))
        self.handle, self.device, self._stream = h, dev, None

    @classmethod
    def get(cls, device="cpu"):
        dev = _parse_device(device)
        ctx = cls._cache.get(dev)
        if ctx is None:
            ctx = cls._cache[dev] = Context(dev)
        return ctx

    @property
    def num_workers(self):
        return api.kva_context_num_workers(self.handle)

    def set_stream(self, stream):
        """CUDA stream handle (int, or a torch.cuda.Stream); None = legacy default."""
        s = getattr(stream, "cuda_stream", stream)
        if s != self._stream:
            check(api.kva_context_set_stream(self.handle, ctypes.c_void_p(s or None)))
            self._stream = s

    def use_current_stream(self):
        """Orders this context's work on torch's current stream (CUDA contexts)."""
        if self.device == "cpu":
            return
        torch = sys.modules.get("torch")
        if torch is not None:
            self.set_stream(torch.cuda.current_stream(self.device[1]).cuda_stream)

    def synchronize(self):
        check(api.kva_synchronize(self.handle))

    def __del__(self):
        if alive and getattr(self, "handle", None):
            api.kva_context_destroy(self.handle)
            self.handle = None


def _parse_device(device):
    if isinstance(device, tuple):
        return device
    d = str(device)
    if d == "cpu":
        return "cpu"
    if d.startswith("cuda"):
        return ("cuda", int(d.split(":")[1]) if ":" in d else 0)
    raise ValueError(f"unknown device {device!r} (cpu, cuda or cuda:N)")


def device_available(device):
    return api.kva_device_available(0 if _parse_device(device) == "cpu" else 1) == 0


class Pool:
    """Paged KV pool with a reference-counted page allocator. Owned buffers
    (Pool(...)) or caller-owned ones (Pool.external(...))."""

    def __init__(self, ctx, *, num_layers, num_pages, page_size, num_kv_heads=1, head_dim=MLA_HEAD_DIM,
                 kv_dtype="float16", layout=LAYOUT_MHA, _external=None):
        self.ctx = ctx if isinstance(ctx, Context) else Context.get(ctx)
        self.config = PoolConfig(layout, num_layers, num_pages, page_size, num_kv_heads, head_dim,
                                 kv_dtype_code(kv_dtype))
        h = ctypes.c_void_p()
        if _external is None:
            check(api.kva_pool_create(self.ctx.handle, ctypes.byref(self.config), ctypes.byref(h)))
            self.buffers = None
        else:
            k_ptrs, v_ptrs, self.buffers = _external
            ks = (ctypes.c_void_p * num_layers)(*k_ptrs)
            vs = (ctypes.c_void_p * num_layers)(*v_ptrs) if v_ptrs is not None else None
            check(api.kva_pool_create_external(self.ctx.handle, ctypes.byref(self.config), ks, vs,
                                               ctypes.byref(h)))
        self.handle = h

    @classmethod
    def external(cls, k_layers, v_layers=None, *, page_size=None, layout=None, _ptrs=None):
        """A pool over caller-owned per-layer buffers: MHA k/v [num_pages, page_size,
        num_kv_heads, head_dim]; MLA k [num_pages, page_size, 576] (or [.., 1, 576]),
        v_layers None. The buffers are kept alive by the pool."""
        ks = [A.view(k, f"k_layers[{i}]") for i, k in enumerate(k_layers)]
        if not ks:
            raise ValueError("k_layers is empty")
        mla = v_layers is None if layout is None else layout == LAYOUT_MLA
        vs = None if mla else [A.view(v, f"v_layers[{i}]") for i, v in enumerate(v_layers)]
        k0 = ks[0]
        if mla:
            shape = k0.shape if k0.ndim == 3 else (k0.shape[:2] + k0.shape[3:] if k0.ndim == 4 and k0.shape[2] == 1 else None)
            if shape is None or shape[2] != MLA_HEAD_DIM:
                raise ValueError(f"MLA k buffer: expected [num_pages, page_size, (1,) 576], got "
                                 f"{list(k0.shape)}")
            num_pages, ps, hk, d = shape[0], shape[1], 1, MLA_HEAD_DIM
        else:
            if k0.ndim != 4:
                raise ValueError(f"k buffer: expected [num_pages, page_size, num_kv_heads, head_dim], "
                                 f"got {list(k0.shape)}")
            num_pages, ps, hk, d = k0.shape
        for i, a in enumerate(ks + (vs or [])):
            A.require(a, f"kv buffer {i}", dtypes=(A.F16, A.BF16, A.FP8), shape=k0.shape,
                      device=k0.device)
            if a.dtype != k0.dtype:
                raise TypeError("K/V buffers of different dtypes")
            if a.ptr % 16:
                raise ValueError(f"kv buffer {i}: not 16-byte aligned")
        if vs is not None and len(vs) != len(ks):
            raise ValueError("k_layers and v_layers differ in length")
        ctx = Context.get(k0.device)
        ptrs = _ptrs or ([a.ptr for a in ks], None if vs is None else [a.ptr for a in vs])
        return cls(ctx, num_layers=len(ks), num_pages=num_pages, page_size=page_size or ps,
                   num_kv_heads=hk, head_dim=d, kv_dtype=k0.dtype,
                   layout=LAYOUT_MLA if mla else LAYOUT_MHA,
                   _external=(ptrs[0], ptrs[1], (k_layers, v_layers)))

    # config accessors
    num_layers = property(lambda s: s.config.num_layers)
    num_pages = property(lambda s: s.config.num_pages)
    page_size = property(lambda s: s.config.page_size)
    num_kv_heads = property(lambda s: s.config.num_kv_heads)
    head_dim = property(lambda s: s.config.head_dim)
    kv_dtype = property(lambda s: s.config.kv_dtype)
    is_mla = property(lambda s: s.config.layout == LAYOUT_MLA)

    def set_scale(self, layer, k_scale, v_scale=1.0):
        check(api.kva_pool_set_scale(self.handle, layer, float(k_scale), float(v_scale)))

    def buffer_ptrs(self, layer):
        k, v = ctypes.c_void_p(), ctypes.c_void_p()
        check(api.kva_pool_get_buffers(self.handle, layer, ctypes.byref(k), ctypes.byref(v)))
        return k.value, v.value

    @property
    def num_free_pages(self):
        return api.kva_pool_num_free_pages(self.handle)

    def alloc_pages(self, count):
        import numpy as np
        out = np.empty(count, dtype=np.int32)
        check(api.kva_pool_alloc_pages(self.handle, count, A.i32p(out)))
        return out

    def ref_page(self, page):
        check(api.kva_pool_ref_page(self.handle, page))

    def unref_page(self, page):
        check(api.kva_pool_unref_page(self.handle, page))

    def page_refcount(self, page):
        return api.kva_pool_page_refcount(self.handle, page)

    def check(self):
        check(api.kva_pool_check(self.handle))

    def read_tokens(self, layer, slots):
        """Dequantized float32 host copies (k, v) of tokens at KV slots; v None for MLA."""
        import numpy as np
        s = A.host_int32(slots, "slots").ravel()
        width = self.num_kv_heads * self.head_dim
        k = np.empty((len(s), self.num_kv_heads, self.head_dim), np.float32)
        v = None if self.is_mla else np.empty_like(k)
        check(api.kva_pool_read_tokens(self.handle, layer, len(s), A.i32p(s), k.ctypes.data,
                                       None if v is None else v.ctypes.data))
        del width
        return (k[:, 0, :] if self.is_mla else k), v

    def __del__(self):
        if alive and getattr(self, "handle", None):
            api.kva_pool_destroy(self.handle)
            self.handle = None


class ReqTable:
    """Request slots x positions -> KV slot (SGLang's req_to_token)."""

    def __init__(self, pool, max_requests, max_context_len):
        self.pool = pool
        self.max_requests, self.max_context_len = max_requests, max_context_len
        h = ctypes.c_void_p()
        check(api.kva_req_table_create(pool.handle, max_requests, max_context_len, ctypes.byref(h)))
        self.handle = h

    def alloc(self):
        s = ctypes.c_int()
        check(api.kva_req_alloc(self.handle, ctypes.byref(s)))
        return s.value

    def append(self, slot, num_tokens):
        check(api.kva_req_append(self.handle, slot, num_tokens))

    def fork(self, src_slot, prefix_len):
        s = ctypes.c_int()
        check(api.kva_req_fork(self.handle, src_slot, prefix_len, ctypes.byref(s)))
        return s.value

    def truncate(self, slot, new_len):
        check(api.kva_req_truncate(self.handle, slot, new_len))

    def release(self, slot):
        check(api.kva_req_release(self.handle, slot))

    def length(self, slot):
        return api.kva_req_len(self.handle, slot)

    def tokens(self, slot):
        """Copy of the request's KV slots (req_to_token row), numpy int32."""
        import numpy as np
        n = api.kva_req_len(self.handle, slot)
        if n < 0:
            raise ValueError(f"request slot {slot} is not live")
        p = api.kva_req_tokens(self.handle, slot)
        return np.ctypeslib.as_array(p, (n,)).copy() if n else np.empty(0, np.int32)

    @property
    def num_live(self):
        return api.kva_req_num_live(self.handle)

    def __del__(self):
        if alive and getattr(self, "handle", None):
            api.kva_req_table_destroy(self.handle)
            self.handle = None


def attn_params(sm_scale=None, causal=True, window_left=-1, logit_softcap=0.0):
    if sm_scale is not None and not sm_scale > 0:
        raise ValueError(f"softmax scale must be > 0, got {sm_scale}")
    if logit_softcap is None:
        logit_softcap = 0.0
    if logit_softcap < 0:
        raise ValueError(f"soft-cap must be >= 0, got {logit_softcap}")
    if window_left is None:
        window_left = -1
    return AttnParams(float(sm_scale or 0.0), 1 if causal else 0, int(window_left),
                      float(logit_softcap))


class Plan:
    """Per-step metadata. Plan(table, ...) plans over a request table (update);
    Plan.paged(pool, ...) over caller page tables (update_paged)."""

    def __init__(self, table, *, max_batch, max_q_tokens, num_qo_heads, num_workers=0,
                 split_block=0, deterministic=False, _pool=None, _max_pages=None, _handle=None):
        self.table = table
        self.pool = _pool if _pool is not None else table.pool
        self.config = PlanConfig(max_batch, max_q_tokens, num_qo_heads, num_workers, split_block,
                                 1 if deterministic else 0)
        self.max_pages_per_req = _max_pages
        self.owned = _handle is None
        if _handle is not None:
            self.handle = _handle
            return
        h = ctypes.c_void_p()
        if _pool is None:
            check(api.kva_plan_create(table.handle, ctypes.byref(self.config), ctypes.byref(h)))
        else:
            check(api.kva_plan_create_paged(_pool.handle, ctypes.byref(self.config), _max_pages,
                                            ctypes.byref(h)))
        self.handle = h

    @classmethod
    def paged(cls, pool, *, max_batch, max_q_tokens, num_qo_heads, max_pages_per_req,
              num_workers=0, split_block=0, deterministic=False):
        return cls(None, max_batch=max_batch, max_q_tokens=max_q_tokens, num_qo_heads=num_qo_heads,
                   num_workers=num_workers, split_block=split_block, deterministic=deterministic,
                   _pool=pool,
                   _max_pages=max_pages_per_req)

    num_qo_heads = property(lambda s: s.config.num_qo_heads)

    def update(self, req_slots, num_cached, num_new):
        slots, cached, new = (A.host_int32(x, n).ravel() for x, n in
                              ((req_slots, "req_slots"), (num_cached, "num_cached"),
                               (num_new, "num_new")))
        if not len(slots) == len(cached) == len(new):
            raise ValueError("req_slots, num_cached and num_new differ in length")
        self.pool.ctx.use_current_stream()
        b = Batch(len(slots), A.i32p(slots), A.i32p(cached), A.i32p(new))
        check(api.kva_plan_update(self.handle, ctypes.byref(b)))

    def update_paged(self, num_new, cache_seqlens, page_table):
        new = A.host_int32(num_new, "num_new").ravel()
        seq = A.host_int32(cache_seqlens, "cache_seqlens").ravel()
        pt = A.host_int32(page_table, "page_table")
        if pt.ndim != 2 or pt.shape[0] != len(new) or len(seq) != len(new):
            raise ValueError(f"paged batch: num_new [{len(new)}], cache_seqlens [{len(seq)}], "
                             f"page_table {list(pt.shape)} do not agree")
        self.pool.ctx.use_current_stream()
        self._batch_token = None  # whoever planned before (a FlashInfer wrapper) must re-plan
        b = PagedBatch(len(new), A.i32p(new), A.i32p(seq), A.i32p(pt), pt.shape[1])
        check(api.kva_plan_update_paged(self.handle, ctypes.byref(b)))

    def info(self):
        """PlanInfo as a dict of Python ints and numpy int32 copies."""
        import numpy as np
        i = PlanInfo()
        check(api.kva_plan_get_info(self.handle, ctypes.byref(i)))
        n = i.num_requests

        def arr(p, count):
            return np.ctypeslib.as_array(p, (count,)).copy() if count and p else np.zeros(0, np.int32)
        sched = np.zeros((i.num_workers, 5), np.int32)
        for w in range(i.num_workers):
            s = i.split_schedule[w]
            sched[w] = (s.begin_req, s.begin_pos, s.end_req, s.end_pos, s.begin_split)
        out = {k: getattr(i, k) for k in ("num_requests", "total_q", "total_k", "max_q_len",
                                          "max_k_len", "num_decode", "num_extend",
                                          "page_table_stride", "num_workers", "num_splits_total")}
        out.update(cu_seqlens_q=arr(i.cu_seqlens_q, n + 1), cu_seqlens_k=arr(i.cu_seqlens_k, n + 1),
                   cache_seqlens=arr(i.cache_seqlens, n),
                   page_table=arr(i.page_table, n * i.page_table_stride).reshape(n, i.page_table_stride),
                   kv_indptr=arr(i.kv_indptr, n + 1), kv_last_page_len=arr(i.kv_last_page_len, n),
                   out_cache_loc=arr(i.out_cache_loc, i.total_q), split_schedule=sched,
                   split_indptr=arr(i.split_indptr, n + 1), sched_order=arr(i.sched_order, n))
        out["kv_indices"] = arr(i.kv_indices, int(out["kv_indptr"][-1]) if n else 0)
        return out

    def store_kv(self, layer, k, v=None, *, pool=None):
        """Writes the step's new K/V ([total_q, num_kv_heads, head_dim]; MLA [total_q, 576])
        into the pool at out_cache_loc. pool: the plan's (default) or one of its geometry."""
        pool = self.pool if pool is None else pool
        kv = A.view(k, "k")
        views = [kv]
        if pool.is_mla:
            if v is not None:
                raise ValueError("MLA pool: v must be None (k holds the 576-dim latent)")
            A.require(kv, "k", dtypes=(A.F32, A.F16, A.BF16), ndim=(2, 3))
            if kv.shape[-1] != MLA_HEAD_DIM or (kv.ndim == 3 and kv.shape[1] != 1):
                raise ValueError(f"k: expected [total_q, 576], got {list(kv.shape)}")
        else:
            if v is None:
                raise ValueError("v is required for an MHA pool")
            vv = A.view(v, "v")
            views.append(vv)
            for a, n in ((kv, "k"), (vv, "v")):
                A.require(a, n, dtypes=(A.F32, A.F16, A.BF16),
                          shape=(None, pool.num_kv_heads, pool.head_dim))
            if vv.dtype != kv.dtype or vv.shape != kv.shape:
                raise ValueError("k and v differ in dtype or shape")
        self._check_device(views)
        check(api.kva_store_kv(self.handle, pool.handle, layer, kv.ptr,
                               None if pool.is_mla else views[1].ptr, kv.dtype))

    def attention(self, layer, q, out=None, lse=None, *, params=None, return_lse=False,
                  pool=None):
        """o = attention(q) over the pool's layer for the planned batch. q [total_q, num_qo_heads,
        head_dim] (MLA: 576 -> o 512). Returns o, or (o, lse [total_q, num_qo_heads] f32).
        pool: the plan's (default) or any pool of its geometry (one plan, a pool per layer)."""
        pool = self.pool if pool is None else pool
        qv = A.view(q, "q")
        d_in = MLA_HEAD_DIM if pool.is_mla else pool.head_dim
        d_out = MLA_V_DIM if pool.is_mla else pool.head_dim
        A.require(qv, "q", dtypes=(A.F32, A.F16, A.BF16), shape=(None, self.num_qo_heads, d_in))
        if out is None:
            out = A.empty_like_kind(qv, (qv.shape[0], self.num_qo_heads, d_out), qv.dtype)
        ov = A.require(A.view(out, "out"), "out", dtypes=(qv.dtype,),
                       shape=(qv.shape[0], self.num_qo_heads, d_out))
        views = [qv, ov]
        lv = None
        if lse is None and return_lse:
            lse = A.empty_like_kind(qv, (qv.shape[0], self.num_qo_heads), A.F32)
        if lse is not None:
            lv = A.require(A.view(lse, "lse"), "lse", dtypes=(A.F32,),
                           shape=(qv.shape[0], self.num_qo_heads))
            views.append(lv)
        self._check_device(views)
        p = params if params is not None else attn_params()
        check(api.kva_attention(self.handle, pool.handle, layer, ctypes.byref(p), qv.ptr, ov.ptr,
                                lv.ptr if lv else None, qv.dtype))
        return (out, lse) if lse is not None else out

    def _check_device(self, views):
        dev = A.same_device(views)
        if dev != self.pool.ctx.device:
            raise ValueError(f"arrays on {dev} but the pool is on {self.pool.ctx.device}")
        self.pool.ctx.use_current_stream()

    def __del__(self):
        if alive and getattr(self, "handle", None) and self.owned:
            api.kva_plan_destroy(self.handle)
        self.handle = None


class GraphState:
    """Decode under CUDA graphs (CPU: recorded library calls), see kva_graph_state."""

    def __init__(self, table, *, max_batch, num_qo_heads, max_q_per_req=1, num_workers=0,
                 buckets=None):
        self.table = table
        arr = (ctypes.c_int * len(buckets))(*buckets) if buckets else None
        self.config = GraphConfig(max_batch, max_q_per_req, num_qo_heads, num_workers, arr,
                                  len(buckets) if buckets else 0)
        h = ctypes.c_void_p()
        check(api.kva_graph_state_create(table.handle, ctypes.byref(self.config), ctypes.byref(h)))
        self.handle = h
        self._plan_args = dict(max_batch=max_batch, max_q_tokens=max_batch * max_q_per_req,
                               num_qo_heads=num_qo_heads)

    @property
    def plan(self):
        """The graph state's plan (a view that keeps this graph state alive)."""
        p = Plan(self.table, _handle=api.kva_graph_state_plan(self.handle), **self._plan_args)
        p._graph = self
        return p

    @property
    def buckets(self):
        return [api.kva_graph_bucket_size(self.handle, b)
                for b in range(api.kva_graph_num_buckets(self.handle))]

    def bucket_for(self, batch_size):
        return api.kva_graph_bucket_for(self.handle, batch_size)

    def begin_capture(self, bucket):
        self.table.pool.ctx.use_current_stream()
        check(api.kva_graph_begin_capture(self.handle, bucket))

    def end_capture(self, bucket):
        check(api.kva_graph_end_capture(self.handle, bucket))

    def prepare(self, req_slots, num_cached, num_new):
        slots, cached, new = (A.host_int32(x, n).ravel() for x, n in
                              ((req_slots, "req_slots"), (num_cached, "num_cached"),
                               (num_new, "num_new")))
        b = Batch(len(slots), A.i32p(slots), A.i32p(cached), A.i32p(new))
        bucket = ctypes.c_int()
        self.table.pool.ctx.use_current_stream()
        check(api.kva_graph_prepare(self.handle, ctypes.byref(b), ctypes.byref(bucket)))
        return bucket.value

    def replay(self, bucket):
        self.table.pool.ctx.use_current_stream()
        check(api.kva_graph_replay(self.handle, bucket))

    def __del__(self):
        if alive and getattr(self, "handle", None):
            api.kva_graph_state_destroy(self.handle)
            self.handle = None
