"""KvattnAttnBackend (SGLang's shape) and the core objects on the CPU, against float64."""
import types

import numpy as np
import pytest
from ref import attention, randn, rel_err, tol

import kvattn


def _layer(layer_id, hq, d, **kw):
    return types.SimpleNamespace(layer_id=layer_id, tp_q_head_num=hq, head_dim=d, scaling=None,
                                 logit_cap=0.0, sliding_window_size=-1, **kw)


def _kv_of(pool, table, layer, slot):
    k, v = pool.read_tokens(layer, table.tokens(slot))
    return k, v


class Mode:
    def __init__(self, decode):
        self.decode = decode

    def is_decode(self):
        return self.decode


def test_backend_extend_then_decode_two_layers():
    rng = np.random.default_rng(21)
    hq, hk, d, ps = 8, 2, 64, 16
    pool = kvattn.Pool("cpu", num_layers=2, num_pages=64, page_size=ps, num_kv_heads=hk, head_dim=d,
                       kv_dtype="bf16")
    table = kvattn.ReqTable(pool, 8, 512)
    be = kvattn.KvattnAttnBackend(pool, table, hq, max_batch=8, max_q_tokens=256)
    slots = [table.alloc() for _ in range(3)]
    prompt = [13, 40, 5]
    for s, n in zip(slots, prompt):
        table.append(s, n)
    fb = types.SimpleNamespace(forward_mode=Mode(False), req_pool_indices=np.array(slots),
                               seq_lens=np.array(prompt), extend_seq_lens=np.array(prompt))
    be.init_forward_metadata(fb)
    assert len(be.out_cache_loc()) == sum(prompt)
    layers = [_layer(0, hq, d), _layer(1, hq, d, )]
    layers[1].logit_cap, layers[1].sliding_window_size = 4.0, 9
    T = sum(prompt)
    for step in range(2):
        for layer in layers:
            q = randn(rng, (T, hq * d))
            k, v = randn(rng, (T, hk, d)), randn(rng, (T, hk, d))
            fn = be.forward_extend if step == 0 else be.forward_decode
            o = fn(q, k, v, layer, fb)
            assert o.shape == (T, hq * d)
            at = 0
            lens = fb.extend_seq_lens if step == 0 else np.ones(3, int)
            for s, n in zip(slots, lens):
                kk, vv = _kv_of(pool, table, layer.layer_id, s)
                # stored K is the bf16 rounding of what was sent
                np.testing.assert_allclose(kk[-n:], k[at:at + n], rtol=2 ** -8, atol=0)
                ro, _ = attention(q[at:at + n].reshape(n, hq, d), kk, vv, causal=True,
                                  window_left=layer.sliding_window_size, softcap=layer.logit_cap)
                assert rel_err(o[at:at + n].reshape(n, hq, d), ro) < tol(np.float32)
                at += n
        # next step: one decode token per request
        for s in slots:
            table.append(s, 1)
        fb = types.SimpleNamespace(forward_mode="decode", req_pool_indices=np.array(slots),
                                   seq_lens=np.array([table.length(s) for s in slots]))
        be.init_forward_metadata(fb)
        T = 3


def test_backend_graph_path_on_cpu():
    """The graph path: capture-time metadata on stand-in requests, replay on real ones."""
    rng = np.random.default_rng(4)
    hq, hk, d = 4, 4, 32
    pool = kvattn.Pool("cpu", num_layers=1, num_pages=64, page_size=8, num_kv_heads=hk, head_dim=d)
    table = kvattn.ReqTable(pool, 16, 256)
    be = kvattn.KvattnAttnBackend(pool, table, hq)
    be.init_cuda_graph_state(4)
    free_after_state = pool.num_free_pages
    be.init_forward_metadata_capture_cuda_graph(4, 4, np.zeros(4), np.ones(4), None, "decode")
    slots = [table.alloc() for _ in range(3)]
    for s, n in zip(slots, (30, 7, 1)):
        table.append(s, n)
    seq = np.array([table.length(s) for s in slots])
    be.init_forward_metadata_replay_cuda_graph(3, np.array(slots), seq, int(seq.sum()), None, "decode")
    layer = _layer(0, hq, d)
    q, k, v = randn(rng, (3, hq * d)), randn(rng, (3, hk, d)), randn(rng, (3, hk, d))
    o = be.forward_decode(q, k, v, layer, None)
    for i, s in enumerate(slots):
        kk, vv = _kv_of(pool, table, 0, s)
        ro, _ = attention(q[i].reshape(1, hq, d), kk, vv, causal=True)
        assert rel_err(o[i].reshape(1, hq, d), ro) < tol(np.float32)
    for s in slots:
        table.release(s)
    be.release_cuda_graph_state()
    assert pool.num_free_pages == free_after_state + 4
    pool.check()


def test_core_objects_and_c_errors():
    pool = kvattn.Pool("cpu", num_layers=1, num_pages=4, page_size=4, num_kv_heads=1, head_dim=8)
    table = kvattn.ReqTable(pool, 2, 64)
    s = table.alloc()
    table.append(s, 6)
    f = table.fork(s, 5)  # one shared page, the partial one copied
    assert pool.page_refcount(table.tokens(s)[0] // 4) == 2
    assert pool.num_free_pages == 1
    with pytest.raises(kvattn.KvattnError) as e:
        table.append(f, 20)
    assert e.value.status == "KVA_ERR_OUT_OF_PAGES" and "kva_req_append" in str(e.value)
    assert pool.num_free_pages == 1  # all or nothing
    table.truncate(s, 2)
    table.release(s)
    table.release(f)
    assert pool.num_free_pages == 4
    pool.check()
    with pytest.raises(kvattn.KvattnError, match="KVA_ERR_DOUBLE_FREE"):
        pool.unref_page(0)
    plan = kvattn.Plan(table, max_batch=2, max_q_tokens=8, num_qo_heads=2)
    with pytest.raises(kvattn.KvattnError, match="KVA_ERR"):
        plan.update([1], [0], [1])  # slot 1 is not live
    with pytest.raises(ValueError):
        plan.update([0, 1], [0], [1])
    with pytest.raises(ValueError, match="unknown device"):
        kvattn.Context("tpu")


def test_plan_info_matches_page_table():
    pool = kvattn.Pool("cpu", num_layers=1, num_pages=16, page_size=4, num_kv_heads=1, head_dim=8)
    table = kvattn.ReqTable(pool, 4, 64)
    slots = [table.alloc(), table.alloc()]
    table.append(slots[0], 9)
    table.append(slots[1], 3)
    plan = kvattn.Plan(table, max_batch=4, max_q_tokens=16, num_qo_heads=1)
    plan.update(slots, [7, 0], [2, 3])
    info = plan.info()
    assert info["num_requests"] == 2 and info["total_q"] == 5
    assert info["cache_seqlens"].tolist() == [9, 3]
    tok = table.tokens(slots[0])
    assert info["out_cache_loc"][:2].tolist() == tok[7:9].tolist()
    assert info["page_table"][0, :3].tolist() == (tok[::4] // 4).tolist()


def test_backend_mla_decode():
    """MLA pool through the backend (decode). Needs the C MLA attention (mla-cpu)."""
    rng = np.random.default_rng(31)
    hq = 16
    pool = kvattn.Pool("cpu", num_layers=1, num_pages=32, page_size=16, kv_dtype="f16",
                       layout=kvattn.LAYOUT_MLA)
    table = kvattn.ReqTable(pool, 4, 256)
    be = kvattn.KvattnAttnBackend(pool, table, hq)
    slots = [table.alloc(), table.alloc()]
    for s, n in zip(slots, (40, 3)):
        table.append(s, n)
    fb = types.SimpleNamespace(forward_mode="decode", req_pool_indices=np.array(slots),
                               seq_lens=np.array([40, 3]))
    be.init_forward_metadata(fb)
    # fill the history through a store of every token: plan each request's full length as new
    hist = kvattn.Plan(table, max_batch=4, max_q_tokens=64, num_qo_heads=hq)
    hist.update(slots, [0, 0], [39, 2])
    hist.store_kv(0, randn(rng, (41, 576)))
    q, lat = randn(rng, (2, hq * 576)), randn(rng, (2, 576))
    try:
        o = be.forward_decode(q, lat, None, _layer(0, hq, 576), fb)
    except kvattn.KvattnError as e:
        if e.status == "KVA_ERR_UNSUPPORTED":
            pytest.skip(f"SKIP: MLA attention not built in this libkvattn ({e.message})")
        raise
    assert o.shape == (2, hq * 512)
    for i, s in enumerate(slots):
        k, _ = pool.read_tokens(0, table.tokens(s))
        ro, _ = attention(q[i].reshape(1, hq, 576), k[:, None, :], k[:, None, :512], causal=True)
        assert rel_err(o[i].reshape(1, hq, 512), ro) < tol(np.float32)


def test_dlpack_producer_on_cpu():
    """Any DLPack producer is read zero-copy (here numpy behind a wrapper)."""
    rng = np.random.default_rng(12)

    class DL:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, stream=None):
            return self.a.__dlpack__()

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    kc = randn(rng, (4, 16, 1, 64), np.float16)
    q = randn(rng, (1, 1, 2, 64))
    pt = np.array([[2, 0]], np.int32)
    a = kvattn.flash_attn_with_kvcache(DL(q), DL(kc), DL(kc), cache_seqlens=20, page_table=pt)
    b = kvattn.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=20, page_table=pt)
    np.testing.assert_array_equal(a, b)


def test_external_pool_and_paged_plan():
    """Pool.external over caller arrays + Plan.paged: stores land in the caller's array."""
    rng = np.random.default_rng(8)
    k_layers = [randn(rng, (6, 4, 2, 16), np.float16) for _ in range(2)]
    v_layers = [randn(rng, (6, 4, 2, 16), np.float16) for _ in range(2)]
    pool = kvattn.Pool.external(k_layers, v_layers)
    assert (pool.num_layers, pool.num_pages, pool.page_size) == (2, 6, 4)
    plan = kvattn.Plan.paged(pool, max_batch=2, max_q_tokens=8, num_qo_heads=4, max_pages_per_req=3)
    plan.update_paged([2, 1], [6, 9], [[5, 2, 0], [1, 3, 4]])
    k, v = randn(rng, (3, 2, 16)), randn(rng, (3, 2, 16))
    plan.store_kv(1, k, v)
    # request 0 positions 4, 5 -> page 2 offsets 0, 1; request 1 position 8 -> page 4 offset 0
    np.testing.assert_array_equal(k_layers[1][2, :2], k[:2].astype(np.float16))
    np.testing.assert_array_equal(v_layers[1][4, 0], v[2].astype(np.float16))
    q = randn(rng, (3, 4, 16))
    o = plan.attention(1, q)
    kk = np.concatenate([k_layers[1][p] for p in (5, 2)])[:6]
    vv = np.concatenate([v_layers[1][p] for p in (5, 2)])[:6]
    ro, _ = attention(q[:2], kk, vv, causal=True)
    assert rel_err(o[:2], ro) < tol(np.float32)
    with pytest.raises(kvattn.KvattnError, match="KVA_ERR_STATE"):
        plan.update([0], [0], [1])  # a paged plan refuses request-table batches
    with pytest.raises(ValueError, match="contiguous"):
        kvattn.Pool.external([k_layers[0][:, ::2]], [v_layers[0][:, ::2]])
