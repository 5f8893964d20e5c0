"""Pools over caller buffers and their plans, cached so that the drop-in calls
do not create C objects (plans allocate device memory) on the hot path.

A caller buffer pair (one layer's cache) is one pool. A C plan serves any pool
of its pool's geometry (layout, pages, page size, heads, dim, dtype), so plans
are cached per geometry and head count, grown by doubling, and one planned
batch serves every layer (FlashInfer's plan once, run per layer). Cached pools
hold raw pointers, not the caller's arrays (holding them would keep freed
caches alive): a pool is only used inside a call that passed its buffers, and
a new buffer at the same address with the same geometry is the same pool.
"""
import collections

from .core import LAYOUT_MHA, Context, Plan, Pool

MAX_POOLS = 1024  # distinct caller buffers (layers x caches) kept before evicting
_pools = collections.OrderedDict()
# (device, geometry, num_qo_heads) -> plan; kept apart from the pools so that
# no reference cycle leaves the destruction order (plan before pool) to the gc.
# A plan holds its first pool (Plan.pool), which keeps that C pool alive.
_plans = {}


def _geometry(pool):
    c = pool.config
    return (pool.ctx.device, c.layout, c.num_pages, c.page_size, c.num_kv_heads, c.head_dim,
            c.kv_dtype)


def external_pool(k, v, *, page_size, pages_view_shape, layout=LAYOUT_MHA, v_offset_bytes=0,
                  page_ids_scale=1):
    """The cached pool over one layer's caller buffers k (and v). pages_view_shape is the
    [num_pages, page_size, heads, dim] the pool sees; v_offset_bytes/page_ids_scale let
    FlashInfer's interleaved [pages, 2, ...] cache be seen as K/V pools (see flashinfer.py)."""
    num_pages, ps, hk, d = pages_view_shape
    kptr = k.ptr
    vptr = None if v is None else v.ptr + v_offset_bytes
    key = (k.device, layout, kptr, vptr, num_pages, ps, hk, d, k.dtype)
    pool = _pools.get(key)
    if pool is not None:
        _pools.move_to_end(key)
        return pool
    ctx = Context.get(k.device)
    pool = Pool(ctx, num_layers=1, num_pages=num_pages, page_size=ps, num_kv_heads=hk,
                head_dim=d, kv_dtype=k.dtype, layout=layout,
                _external=([kptr], None if vptr is None else [vptr], None))
    _pools[key] = pool
    while len(_pools) > MAX_POOLS:
        _pools.popitem(last=False)
    return pool


def paged_plan(pool, *, num_qo_heads, batch, q_tokens, pages_per_req, num_workers=0):
    """A paged plan for pool's geometry with at least the given capacities (grown by
    doubling). Pass pool= to its store_kv/attention: it may be another pool than Plan.pool."""
    key = _geometry(pool) + (num_qo_heads,)
    plan = _plans.get(key)
    if plan is not None and (plan.config.max_batch >= batch and plan.config.max_q_tokens >= q_tokens
                             and plan.max_pages_per_req >= pages_per_req
                             and plan.config.num_workers == num_workers):
        return plan
    grow = (lambda old, need: max(need, 2 * old)) if plan is not None else (lambda old, need: need)
    old = plan.config if plan is not None else None
    plan = Plan.paged(pool, num_qo_heads=num_qo_heads,
                      max_batch=grow(old.max_batch if old else 0, max(batch, 8)),
                      max_q_tokens=grow(old.max_q_tokens if old else 0, max(q_tokens, 64)),
                      max_pages_per_req=grow(_plans[key].max_pages_per_req
                                             if old else 0, max(pages_per_req, 1)),
                      num_workers=num_workers)
    _plans[key] = plan
    return plan


def clear():
    """Drops every cached pool and plan (tests; or to release device memory)."""
    _plans.clear()
    _pools.clear()

