"""An attention backend in SGLang's shape, for an engine that adopts kvattn whole:
the engine's KV pool is a kvattn.Pool and its req_to_token pool a kvattn.ReqTable.

Before each forward the engine grows each request in the table by its new
tokens (ReqTable.append: the allocation SGLang does with its token allocator);
the plan then knows every new token's KV slot (out_cache_loc()). Duck-typed
inputs:
  forward_batch: forward_mode (SGLang's ForwardMode, or "decode"/"extend"),
    req_pool_indices ([bs] request slots of the ReqTable), seq_lens ([bs]
    lengths including the new tokens; seq_lens_cpu used when present),
    extend_seq_lens / extend_seq_lens_cpu (extend: new tokens per request).
  layer: layer_id, tp_q_head_num, head_dim, scaling, logit_cap,
    sliding_window_size (SGLang's RadixAttention attributes; missing = default).
Index arrays are read on the host once per step (init_forward_metadata); the
CUDA-graph path plans into fixed device buffers without synchronizing.
"""
import numpy as np

from . import _arrays as A
from .core import MLA_HEAD_DIM, MLA_V_DIM, GraphState, Plan, attn_params


def _is_decode(mode):
    if isinstance(mode, str):
        return mode == "decode"
    return bool(mode.is_decode())


def _host(x, name):
    return A.host_int32(x, name).ravel()


class KvattnAttnBackend:
    def __init__(self, pool, req_table, num_qo_heads, *, max_batch=256, max_q_tokens=8192,
                 num_workers=0):
        if req_table.pool is not pool:
            raise ValueError("req_table was not made from pool")
        self.pool, self.table, self.num_qo_heads = pool, req_table, num_qo_heads
        self.plan = Plan(req_table, max_batch=max_batch, max_q_tokens=max_q_tokens,
                         num_qo_heads=num_qo_heads, num_workers=num_workers)
        self.graph = None
        self._active = self.plan
        self._dummy_slots = []

    # ---- eager steps --------------------------------------------------------
    def init_forward_metadata(self, forward_batch):
        slots, cached, new = self._batch(forward_batch)
        self.plan.update(slots, cached, new)
        self._active = self.plan

    def _batch(self, fb):
        slots = _host(fb.req_pool_indices, "req_pool_indices")
        seq = getattr(fb, "seq_lens_cpu", None)
        seq = _host(seq if seq is not None else fb.seq_lens, "seq_lens")
        if len(seq) != len(slots):
            raise ValueError("req_pool_indices and seq_lens differ in length")
        if _is_decode(fb.forward_mode):
            new = np.ones(len(slots), np.int32)
        else:
            ext = getattr(fb, "extend_seq_lens_cpu", None)
            new = _host(ext if ext is not None else fb.extend_seq_lens, "extend_seq_lens")
            if len(new) != len(slots):
                raise ValueError("extend_seq_lens and req_pool_indices differ in length")
        if np.any(new > seq):
            raise ValueError("a request has more new tokens than its seq_len")
        return slots, (seq - new).astype(np.int32), new

    def out_cache_loc(self):
        """KV slot of each new token of the current step (numpy int32)."""
        return self._active.info()["out_cache_loc"]

    def forward(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        fn = self.forward_decode if _is_decode(forward_batch.forward_mode) else self.forward_extend
        return fn(q, k, v, layer, forward_batch, save_kv_cache)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        if self.pool.is_mla:
            raise ValueError("MLA pools: kvattn runs MLA decode only (no extend)")
        return self._run(q, k, v, layer, save_kv_cache)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        return self._run(q, k, v, layer, save_kv_cache)

    def _run(self, q, k, v, layer, save_kv_cache):
        plan, pool = self._active, self.pool
        hq = getattr(layer, "tp_q_head_num", self.num_qo_heads)
        if hq != self.num_qo_heads:
            raise ValueError(f"layer has {hq} q heads, the backend {self.num_qo_heads}")
        d_in = MLA_HEAD_DIM if pool.is_mla else pool.head_dim
        d_out = MLA_V_DIM if pool.is_mla else pool.head_dim
        qv = A.view(q, "q")
        if qv.ndim not in (2, 3) or qv.numel() % (hq * d_in):
            raise ValueError(f"q: expected [tokens, {hq} * {d_in}] or [tokens, {hq}, {d_in}], "
                             f"got {list(qv.shape)}")
        tokens = qv.shape[0]
        if save_kv_cache and k is not None:
            kv = A.view(k, "k")
            if pool.is_mla:
                plan.store_kv(layer.layer_id, A.reshape(kv, (tokens, MLA_HEAD_DIM)))
            else:
                shape = (tokens, pool.num_kv_heads, pool.head_dim)
                plan.store_kv(layer.layer_id, A.reshape(kv, shape), A.reshape(A.view(v, "v"), shape))
        window = getattr(layer, "sliding_window_size", -1)
        params = attn_params(getattr(layer, "scaling", None), True,
                             -1 if window is None else window, getattr(layer, "logit_cap", 0.0))
        o = plan.attention(layer.layer_id, A.reshape(qv, (tokens, hq, d_in)), params=params)
        return o.reshape(tokens, hq * d_out)

    # ---- CUDA graphs (decode) ------------------------------------------------
    def init_cuda_graph_state(self, max_bs, max_num_tokens=None):
        """Fixed-address plan for decode batches up to max_bs. max_bs request slots of one
        token (one page each) are kept as the stand-in requests of capture-time batches: a plan
        names each request once, and capture needs a valid plan (see below)."""
        self.graph = GraphState(self.table, max_batch=max_bs, num_qo_heads=self.num_qo_heads,
                                max_q_per_req=1)
        self._dummy_slots = self._dummy_slots or []
        while len(self._dummy_slots) < max_bs:
            s = self.table.alloc()
            self._dummy_slots.append(s)
            self.table.append(s, 1)

    def release_cuda_graph_state(self):
        for s in self._dummy_slots or []:
            self.table.release(s)
        self._dummy_slots, self.graph = [], None

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens,
                                                 encoder_lens=None, forward_mode=None,
                                                 spec_info=None):
        """Plans bs stand-in requests of one token so the kernels captured by the caller's graph
        (torch.cuda.graph) see a valid plan; in a graph state's plan their launch configuration
        depends only on its capacities, so the graph replays any batch of up to bs requests."""
        self._check_graph(forward_mode, spec_info)
        slots = np.array(self._dummy_slots[:bs], np.int32)
        self.graph.prepare(slots, np.zeros(bs, np.int32), np.ones(bs, np.int32))
        self._active = self.graph.plan

    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens,
                                                seq_lens_sum=None, encoder_lens=None,
                                                forward_mode=None, spec_info=None,
                                                seq_lens_cpu=None):
        """Plans the real batch into the graph state's fixed buffers (an asynchronous upload on
        the current stream); the caller then replays its graph."""
        self._check_graph(forward_mode, spec_info)
        slots = _host(req_pool_indices, "req_pool_indices")[:bs]
        seq = _host(seq_lens_cpu if seq_lens_cpu is not None else seq_lens, "seq_lens")[:bs]
        self.graph.prepare(slots, seq - 1, np.ones(bs, np.int32))
        self._active = self.graph.plan

    def _check_graph(self, forward_mode, spec_info):
        if self.graph is None:
            raise ValueError("init_cuda_graph_state first")
        if spec_info is not None:
            raise ValueError("spec_info: speculative steps under graphs are not wired here")
        if forward_mode is not None and not _is_decode(forward_mode):
            raise ValueError("kvattn graphs run decode steps only")
