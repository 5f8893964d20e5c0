"""Locates and loads libkvattn.so and declares the C API for ctypes.

Search order: $KVATTN_LIBRARY, the copy bundled by `pip install` (kvattn/lib/),
the source tree's build directories (build, build-cuda, build-py/lib), then the
system's library path.
"""
import atexit
import ctypes
import ctypes.util
import os

c_int = ctypes.c_int
c_float = ctypes.c_float
c_void_p = ctypes.c_void_p
c_i32p = ctypes.POINTER(ctypes.c_int32)


class KvattnError(RuntimeError):
    """A C call failed. `status` is the kva_status name, `message` kva_last_error."""

    def __init__(self, status, message, code=None):
        super().__init__(f"{status}: {message}" if message else status)
        self.status = status
        self.code = code
        self.message = message


# ---- structs (mirror include/kvattn.h) -----------------------------------

class ContextConfig(ctypes.Structure):
    _fields_ = [("device", c_int), ("num_threads", c_int), ("cuda_device", c_int)]


class PoolConfig(ctypes.Structure):
    _fields_ = [("layout", c_int), ("num_layers", c_int), ("num_pages", c_int),
                ("page_size", c_int), ("num_kv_heads", c_int), ("head_dim", c_int),
                ("kv_dtype", c_int)]


class Batch(ctypes.Structure):
    _fields_ = [("num_requests", c_int), ("req_slots", c_i32p), ("num_cached", c_i32p),
                ("num_new", c_i32p)]


class PagedBatch(ctypes.Structure):
    _fields_ = [("num_requests", c_int), ("num_new", c_i32p), ("cache_seqlens", c_i32p),
                ("page_table", c_i32p), ("page_table_stride", c_int)]


class PlanConfig(ctypes.Structure):
    _fields_ = [("max_batch", c_int), ("max_q_tokens", c_int), ("num_qo_heads", c_int),
                ("num_workers", c_int), ("split_block", c_int), ("deterministic", c_int)]


class SplitWork(ctypes.Structure):
    _fields_ = [("begin_req", ctypes.c_int32), ("begin_pos", ctypes.c_int32),
                ("end_req", ctypes.c_int32), ("end_pos", ctypes.c_int32),
                ("begin_split", ctypes.c_int32)]


class PlanInfo(ctypes.Structure):
    _fields_ = [("num_requests", c_int), ("total_q", c_int), ("total_k", c_int),
                ("max_q_len", c_int), ("max_k_len", c_int), ("num_decode", c_int),
                ("num_extend", c_int), ("cu_seqlens_q", c_i32p), ("cu_seqlens_k", c_i32p),
                ("cache_seqlens", c_i32p), ("page_table", c_i32p), ("page_table_stride", c_int),
                ("kv_indptr", c_i32p), ("kv_indices", c_i32p), ("kv_last_page_len", c_i32p),
                ("out_cache_loc", c_i32p), ("num_workers", c_int),
                ("split_schedule", ctypes.POINTER(SplitWork)), ("split_indptr", c_i32p),
                ("num_splits_total", c_int), ("sched_order", c_i32p)]


class AttnParams(ctypes.Structure):
    _fields_ = [("sm_scale", c_float), ("causal", c_int), ("window_left", c_int),
                ("logit_softcap", c_float)]


class GraphConfig(ctypes.Structure):
    _fields_ = [("max_batch", c_int), ("max_q_per_req", c_int), ("num_qo_heads", c_int),
                ("num_workers", c_int), ("buckets", ctypes.POINTER(c_int)), ("num_buckets", c_int)]


P = ctypes.POINTER
_PROTOS = {
    "kva_strerror": (ctypes.c_char_p, [c_int]),
    "kva_last_error": (ctypes.c_char_p, []),
    "kva_dtype_size": (ctypes.c_size_t, [c_int]),
    "kva_device_available": (c_int, [c_int]),
    "kva_context_create": (c_int, [P(ContextConfig), P(c_void_p)]),
    "kva_context_destroy": (None, [c_void_p]),
    "kva_context_num_workers": (c_int, [c_void_p]),
    "kva_context_set_stream": (c_int, [c_void_p, c_void_p]),
    "kva_synchronize": (c_int, [c_void_p]),
    "kva_pool_create": (c_int, [c_void_p, P(PoolConfig), P(c_void_p)]),
    "kva_pool_destroy": (None, [c_void_p]),
    "kva_pool_set_scale": (c_int, [c_void_p, c_int, c_float, c_float]),
    "kva_pool_get_buffers": (c_int, [c_void_p, c_int, P(c_void_p), P(c_void_p)]),
    "kva_pool_num_free_pages": (c_int, [c_void_p]),
    "kva_pool_alloc_pages": (c_int, [c_void_p, c_int, c_i32p]),
    "kva_pool_ref_page": (c_int, [c_void_p, ctypes.c_int32]),
    "kva_pool_unref_page": (c_int, [c_void_p, ctypes.c_int32]),
    "kva_pool_page_refcount": (c_int, [c_void_p, ctypes.c_int32]),
    "kva_pool_check": (c_int, [c_void_p]),
    "kva_pool_read_tokens": (c_int, [c_void_p, c_int, c_int, c_i32p, c_void_p, c_void_p]),
    "kva_req_table_create": (c_int, [c_void_p, c_int, c_int, P(c_void_p)]),
    "kva_req_table_destroy": (None, [c_void_p]),
    "kva_req_alloc": (c_int, [c_void_p, P(c_int)]),
    "kva_req_append": (c_int, [c_void_p, c_int, c_int]),
    "kva_req_fork": (c_int, [c_void_p, c_int, c_int, P(c_int)]),
    "kva_req_truncate": (c_int, [c_void_p, c_int, c_int]),
    "kva_req_release": (c_int, [c_void_p, c_int]),
    "kva_req_len": (c_int, [c_void_p, c_int]),
    "kva_req_tokens": (c_i32p, [c_void_p, c_int]),
    "kva_req_num_live": (c_int, [c_void_p]),
    "kva_plan_create": (c_int, [c_void_p, P(PlanConfig), P(c_void_p)]),
    "kva_plan_destroy": (None, [c_void_p]),
    "kva_plan_update": (c_int, [c_void_p, P(Batch)]),
    "kva_plan_get_info": (c_int, [c_void_p, P(PlanInfo)]),
    "kva_store_kv": (c_int, [c_void_p, c_void_p, c_int, c_void_p, c_void_p, c_int]),
    "kva_attention": (c_int, [c_void_p, c_void_p, c_int, P(AttnParams), c_void_p, c_void_p,
                              c_void_p, c_int]),
    "kva_merge_states": (c_int, [c_void_p, c_int, c_int, c_int, c_int, c_void_p, c_void_p,
                                 c_void_p, c_void_p, c_void_p, c_void_p]),
    "kva_graph_state_create": (c_int, [c_void_p, P(GraphConfig), P(c_void_p)]),
    "kva_graph_state_destroy": (None, [c_void_p]),
    "kva_graph_state_plan": (c_void_p, [c_void_p]),
    "kva_graph_num_buckets": (c_int, [c_void_p]),
    "kva_graph_bucket_size": (c_int, [c_void_p, c_int]),
    "kva_graph_bucket_for": (c_int, [c_void_p, c_int]),
    "kva_graph_begin_capture": (c_int, [c_void_p, c_int]),
    "kva_graph_end_capture": (c_int, [c_void_p, c_int]),
    "kva_graph_prepare": (c_int, [c_void_p, P(Batch), P(c_int)]),
    "kva_graph_replay": (c_int, [c_void_p, c_int]),
    # caller-owned buffers and page tables ("Paged plans over caller page tables")
    "kva_pool_create_external": (c_int, [c_void_p, P(PoolConfig), P(c_void_p), P(c_void_p),
                                         P(c_void_p)]),
    "kva_plan_create_paged": (c_int, [c_void_p, P(PlanConfig), c_int, P(c_void_p)]),
    "kva_plan_update_paged": (c_int, [c_void_p, P(PagedBatch)]),
}

_HERE = os.path.dirname(os.path.abspath(__file__))


def _candidates():
    env = os.environ.get("KVATTN_LIBRARY")
    if env:
        return [env]  # pointed to: nothing else is tried
    out = [os.path.join(_HERE, "lib", "libkvattn.so")]
    root = os.path.dirname(os.path.dirname(_HERE))  # python/kvattn -> repo root
    for d in ("build", "build-cuda", os.path.join("build-py", "lib")):
        out.append(os.path.join(root, d, "libkvattn.so"))
    found = ctypes.util.find_library("kvattn")
    if found:
        out.append(found)
    return out


def _load():
    tried = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            tried.append(path + " (absent)")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
            continue
        lib._kvattn_path = path
        return lib
    raise ImportError("kvattn: libkvattn.so not found; build it (cmake --build build) or set "
                      "KVATTN_LIBRARY. Tried: " + "; ".join(tried))


class _Api:
    """The C functions; a symbol the loaded library lacks raises KvattnError when used."""

    def __init__(self, lib):
        self.lib = lib
        self.path = lib._kvattn_path
        self.missing = []
        for name, (res, args) in _PROTOS.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                self.missing.append(name)
                setattr(self, name, _missing(name, self.path))
                continue
            fn.restype = res
            fn.argtypes = args
            setattr(self, name, fn)

    def has(self, name):
        return name not in self.missing


def _missing(name, path):
    def fn(*_args):
        raise KvattnError("KVA_ERR_UNSUPPORTED", f"{name} is not in {path} (library too old)")
    return fn


api = _Api(_load())

# At interpreter exit objects are torn down in no particular order (a context
# could go before its pools): from then on destructors leave memory to the OS.
alive = [True]
atexit.register(alive.clear)


def check(status):
    """Raises KvattnError carrying kva_strerror and kva_last_error for a non-zero status."""
    if status != 0:
        name = api.kva_strerror(status).decode()
        msg = api.kva_last_error().decode(errors="replace")
        raise KvattnError(name, msg, status)
