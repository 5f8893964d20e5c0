"""flash_attn_with_kvcache on the CPU (numpy) against the float64 reference."""
import numpy as np
import pytest
from ref import attention, lse_tol, randn, rel_err, tol

import kvattn


def _paged_cache(rng, num_pages, ps, hk, d, dtype=np.float16):
    return randn(rng, (num_pages, ps, hk, d), dtype), randn(rng, (num_pages, ps, hk, d), dtype)


def _gather(cache, pages, n, ps):
    return np.concatenate([cache[p] for p in pages])[:n] if n else cache[:0, 0]


@pytest.mark.parametrize("qdt", [np.float32, np.float16])
@pytest.mark.parametrize("ps,hq,hk,d", [(16, 4, 2, 64), (1, 8, 1, 128), (7, 2, 2, 32)])
def test_paged_decode_and_extend(qdt, ps, hq, hk, d):
    rng = np.random.default_rng(ps * 1000 + hq * 10 + d)
    batch, sq = 3, 3
    seqlens = np.array([5, 40, 17], np.int32)
    maxp = (int(seqlens.max()) + ps - 1) // ps
    num_pages = batch * maxp + 5
    kc, vc = _paged_cache(rng, num_pages, ps, hk, d)
    perm = rng.permutation(num_pages)[: batch * maxp].reshape(batch, maxp).astype(np.int32)
    q = randn(rng, (batch, sq, hq, d), qdt)
    for causal in (False, True):
        out, lse = kvattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, page_table=perm,
                                                  causal=causal, return_softmax_lse=True)
        assert out.shape == q.shape and out.dtype == q.dtype
        assert lse.shape == (batch, hq, sq) and lse.dtype == np.float32
        for b in range(batch):
            n = int(seqlens[b])
            ro, rl = attention(q[b], _gather(kc, perm[b], n, ps), _gather(vc, perm[b], n, ps),
                               causal=causal)
            assert rel_err(out[b], ro) < tol(qdt)
            np.testing.assert_allclose(lse[b], rl.T, atol=lse_tol(qdt) * 10, rtol=0)


def test_append_new_kv_and_options():
    """k/v appended at cache_seqlens, then attention over cache + new; window, softcap, scale."""
    rng = np.random.default_rng(7)
    batch, sq, hq, hk, d, ps = 2, 4, 4, 2, 64, 16
    kc, vc = _paged_cache(rng, 32, ps, hk, d)
    pt = np.array([[3, 9, 4], [10, 11, 0]], np.int32)
    seqlens = np.array([20, 9], np.int32)
    q = randn(rng, (batch, sq, hq, d))
    k, v = randn(rng, (batch, sq, hk, d)), randn(rng, (batch, sq, hk, d))
    before = [(_gather(kc, pt[b], int(seqlens[b]), ps).copy(),
               _gather(vc, pt[b], int(seqlens[b]), ps).copy()) for b in range(batch)]
    out = kvattn.flash_attn_with_kvcache(q, kc, vc, k=k, v=v, cache_seqlens=seqlens, page_table=pt,
                                         causal=True, window_size=(5, 0), softcap=3.0,
                                         softmax_scale=0.2)
    for b in range(batch):
        n = int(seqlens[b]) + sq
        kk, vv = _gather(kc, pt[b], n, ps), _gather(vc, pt[b], n, ps)
        # the new tokens were stored (as f16) after the old ones, which are untouched
        np.testing.assert_array_equal(kk[:-sq], before[b][0])
        np.testing.assert_array_equal(kk[-sq:], k[b].astype(np.float16))
        np.testing.assert_array_equal(vv[-sq:], v[b].astype(np.float16))
        ro, _ = attention(q[b], kk, vv, causal=True, sm_scale=0.2, window_left=5, softcap=3.0)
        assert rel_err(out[b], ro) < tol(np.float32)


def test_non_paged_cache_and_varlen():
    rng = np.random.default_rng(3)
    hq, hk, d, seqlen_cache = 4, 4, 64, 300  # 300 = 2 x 150: pages of 150
    kc = randn(rng, (3, seqlen_cache, hk, d), np.float16)
    vc = randn(rng, (3, seqlen_cache, hk, d), np.float16)
    lens_q = np.array([2, 0, 5], np.int32)
    cu = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    q = randn(rng, (int(cu[-1]), hq, d))
    seqlens = np.array([299, 4, 150], np.int32)
    out, lse = kvattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, cu_seqlens_q=cu,
                                              max_seqlen_q=5, causal=True, return_softmax_lse=True)
    assert lse.shape == (hq, int(cu[-1]))
    for b in range(3):
        if lens_q[b] == 0:
            continue
        n = int(seqlens[b])
        ro, rl = attention(q[cu[b]:cu[b + 1]], kc[b, :n], vc[b, :n], causal=True)
        assert rel_err(out[cu[b]:cu[b + 1]], ro) < tol(np.float32)
        np.testing.assert_allclose(lse[:, cu[b]:cu[b + 1]], rl.T, atol=1e-4, rtol=0)


def test_int_cache_seqlens_and_default_length():
    rng = np.random.default_rng(11)
    kc, vc = _paged_cache(rng, 8, 16, 1, 64)
    pt = np.array([[1, 2], [3, 4]], np.int32)
    q = randn(rng, (2, 1, 2, 64))
    a = kvattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=32, page_table=pt)
    b = kvattn.flash_attn_with_kvcache(q, kc, vc, page_table=pt)  # None = all pages
    np.testing.assert_array_equal(a, b)
    ro, _ = attention(q[1], np.concatenate([kc[3], kc[4]]), np.concatenate([vc[3], vc[4]]),
                      causal=False)
    assert rel_err(a[1], ro) < tol(np.float32)


def test_validation_errors():
    rng = np.random.default_rng(1)
    kc, vc = _paged_cache(rng, 8, 16, 2, 64)
    pt = np.array([[0, 1]], np.int32)
    q = randn(rng, (1, 2, 4, 64))
    f = kvattn.flash_attn_with_kvcache
    with pytest.raises(TypeError):
        f(q.astype(np.float64), kc, vc, cache_seqlens=20, page_table=pt)
    with pytest.raises(TypeError):
        f(q, kc.astype(np.float32), vc.astype(np.float32), cache_seqlens=20, page_table=pt)
    with pytest.raises(TypeError):
        f([1, 2], kc, vc)
    with pytest.raises(ValueError, match="multiple"):
        f(randn(rng, (1, 2, 3, 64)), kc, vc, cache_seqlens=20, page_table=pt)
    with pytest.raises(ValueError, match="head_dim"):
        f(randn(rng, (1, 2, 4, 32)), kc, vc, cache_seqlens=20, page_table=pt)
    with pytest.raises(ValueError, match="contiguous"):
        f(np.asfortranarray(q), kc, vc, cache_seqlens=20, page_table=pt)
    with pytest.raises(ValueError, match="exceed"):
        f(q, kc, vc, cache_seqlens=40, page_table=pt)
    with pytest.raises(ValueError, match="window_size"):
        f(q, kc, vc, cache_seqlens=20, page_table=pt, window_size=(4, 4))
    with pytest.raises(ValueError, match="new K/V"):
        f(q, kc, vc, k=randn(rng, (1, 1, 2, 64)), v=randn(rng, (1, 1, 2, 64)),
          cache_seqlens=10, page_table=pt)
    with pytest.raises(ValueError, match="uniform"):
        f(q, kc, vc, cache_seqlens=20, page_table=pt, k_descale=np.array([[1.0, 2.0]]))
    with pytest.raises(ValueError, match="rotary_cos"):
        f(q, kc, vc, cache_seqlens=20, page_table=pt, rotary_cos=np.ones(3))
    # a page id beyond the cache is the C library's check: KvattnError with its message
    with pytest.raises(kvattn.KvattnError, match="KVA_ERR_OUT_OF_RANGE.*page_table"):
        f(q, kc, vc, cache_seqlens=20, page_table=np.array([[0, 99]], np.int32))
