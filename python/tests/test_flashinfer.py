"""FlashInfer-shaped wrappers and merge_state on the CPU (numpy) against float64."""
import math

import numpy as np
import pytest
from ref import attention, randn, rel_err, tol

import kvattn


def _ragged(rng, kv_lens, ps, num_pages):
    pages = rng.permutation(num_pages).astype(np.int32)
    indptr, indices, last, at = [0], [], [], 0
    for n in kv_lens:
        np_ = (n + ps - 1) // ps
        indices.extend(pages[at:at + np_])
        at += np_
        indptr.append(len(indices))
        last.append(n - (np_ - 1) * ps)
    return (np.array(indptr, np.int32), np.array(indices, np.int32), np.array(last, np.int32))


def _kv(cache, indptr, indices, r, n):
    return np.concatenate([cache[p] for p in indices[indptr[r]:indptr[r + 1]]])[:n]


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("qdt", [np.float32, np.float16])
def test_decode_wrapper(interleaved, qdt):
    rng = np.random.default_rng(5 + interleaved)
    ps, hq, hk, d, num_pages = 16, 8, 2, 64, 40
    kv_lens = [1, 33, 70, 16]
    indptr, indices, last = _ragged(rng, kv_lens, ps, num_pages)
    if interleaved:
        kv = randn(rng, (num_pages, 2, ps, hk, d), np.float16)
        kc, vc, cache = kv[:, 0], kv[:, 1], kv
    else:
        kc, vc = randn(rng, (num_pages, ps, hk, d), np.float16), randn(rng, (num_pages, ps, hk, d), np.float16)
        cache = (kc, vc)
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(np.empty(1 << 20, np.uint8), "NHD")
    w.plan(indptr, indices, last, hq, hk, d, ps, logits_soft_cap=5.0)
    q = randn(rng, (len(kv_lens), hq, d), qdt)
    for _ in range(2):  # run twice: the second reuses the plan
        out, lse = w.run(q, cache, return_lse=True)
        for r, n in enumerate(kv_lens):
            ro, rl = attention(q[r:r + 1], _kv(kc, indptr, indices, r, n),
                               _kv(vc, indptr, indices, r, n), causal=True, softcap=5.0)
            assert rel_err(out[r], ro[0]) < tol(qdt)
            # FlashInfer's LSE is base 2
            np.testing.assert_allclose(lse[r], rl[0] / math.log(2), atol=2e-4, rtol=0)


def test_prefill_wrapper_causal_window_and_two_layers():
    rng = np.random.default_rng(9)
    ps, hq, hk, d, num_pages = 8, 4, 4, 32, 50
    kv_lens, q_lens = [12, 40, 7], [12, 5, 0]
    indptr, indices, last = _ragged(rng, kv_lens, ps, num_pages)
    qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    layers = [(randn(rng, (num_pages, ps, hk, d), np.float16), randn(rng, (num_pages, ps, hk, d), np.float16))
              for _ in range(2)]
    w = kvattn.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
    w.plan(qo, indptr, indices, last, hq, hk, d, ps, causal=True, window_left=6, sm_scale=0.3)
    q = randn(rng, (int(qo[-1]), hq, d))
    for kc, vc in layers:
        out = w.run(q, (kc, vc))
        for r in range(3):
            if q_lens[r] == 0:
                continue
            ro, _ = attention(q[qo[r]:qo[r + 1]], _kv(kc, indptr, indices, r, kv_lens[r]),
                              _kv(vc, indptr, indices, r, kv_lens[r]), causal=True,
                              window_left=6, sm_scale=0.3)
            assert rel_err(out[qo[r]:qo[r + 1]], ro) < tol(np.float32)


def test_wrapper_errors():
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(None)
    with pytest.raises(ValueError, match="before plan"):
        w.run(np.ones((1, 2, 8), np.float32), (np.ones((1, 1, 1, 8), np.float16),) * 2)
    with pytest.raises(ValueError, match="NHD"):
        kvattn.BatchDecodeWithPagedKVCacheWrapper(None, "HND")
    with pytest.raises(ValueError, match="RoPE"):
        w.plan(np.array([0, 1]), np.array([0]), np.array([1]), 2, 1, 8, 1, pos_encoding_mode="ROPE_LLAMA")
    with pytest.raises(ValueError, match="last_page_len"):
        w.plan(np.array([0, 1]), np.array([0]), np.array([3]), 2, 1, 8, 2)
    w.plan(np.array([0, 1]), np.array([0]), np.array([1]), 2, 1, 8, 1)
    kc = np.ones((1, 1, 1, 8), np.float16)
    with pytest.raises(ValueError, match="differ from the plan"):
        w.run(np.ones((1, 2, 8), np.float32), (np.ones((1, 2, 1, 8), np.float16),) * 2)
    with pytest.raises(ValueError, match="shape"):
        w.run(np.ones((2, 2, 8), np.float32), (kc, kc))
    with pytest.raises(TypeError):
        w.run(np.ones((1, 2, 8), np.float64), (kc, kc))


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_merge_state(dt):
    rng = np.random.default_rng(2)
    va, vb = randn(rng, (7, 3, 64), dt), randn(rng, (7, 3, 64), dt)
    sa, sb = randn(rng, (7, 3)) * 4, randn(rng, (7, 3)) * 4
    sb[0, 0] = -np.inf  # no keys on one side: the other passes through
    v, s = kvattn.merge_state(va, sa, vb, sb)
    wa, wb = np.exp2(sa.astype(np.float64)), np.exp2(sb.astype(np.float64))
    ref = (va * wa[..., None] + vb * wb[..., None]) / (wa + wb)[..., None]
    assert v.dtype == dt and rel_err(v, ref) < tol(dt)
    np.testing.assert_allclose(s, np.log2(wa + wb), atol=1e-5, rtol=0)
    v2, s2 = va.copy(), sa.copy()
    kvattn.merge_state_in_place(v2, s2, vb, sb)
    np.testing.assert_array_equal(v2, v)
    with pytest.raises(ValueError):
        kvattn.merge_state(va, sa, vb[:3], sb)
    with pytest.raises(TypeError):
        kvattn.merge_state(va, sa.astype(np.float16), vb, sb)


def test_one_plan_serves_every_layer(monkeypatch):
    """plan() once, run() per layer: the C plan is updated once for all layers (a plan
    serves any pool of its geometry); an FA3 call on the same geometry in between
    re-plans it, and the next run() notices and plans its own batch again."""
    rng = np.random.default_rng(21)
    ps, hq, hk, d, num_pages = 16, 8, 2, 64, 40
    kv_lens = [5, 47, 90]
    indptr, indices, last = _ragged(rng, kv_lens, ps, num_pages)
    layers = [(randn(rng, (num_pages, ps, hk, d), np.float16), randn(rng, (num_pages, ps, hk, d), np.float16))
              for _ in range(3)]
    calls = []
    orig = kvattn.core.Plan.update_paged
    monkeypatch.setattr(kvattn.core.Plan, "update_paged",
                        lambda self, *a, **k: (calls.append(1), orig(self, *a, **k))[1])
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    w.plan(indptr, indices, last, hq, hk, d, ps)
    q = randn(rng, (len(kv_lens), hq, d))

    def check(out, kc, vc):
        for r, n in enumerate(kv_lens):
            ro, _ = attention(q[r:r + 1], _kv(kc, indptr, indices, r, n), _kv(vc, indptr, indices, r, n),
                              causal=True)
            assert rel_err(out[r], ro[0]) < tol(np.float32)

    for kc, vc in layers:
        check(w.run(q, (kc, vc)), kc, vc)
    assert len(calls) == 1
    # FA3 on the same geometry, another batch: it re-plans the shared plan
    pt = np.arange(8, dtype=np.int32).reshape(2, 4)
    kvattn.flash_attn_with_kvcache(randn(rng, (2, 1, hq, d)), layers[0][0], layers[0][1],
                                   cache_seqlens=np.array([3, 60], np.int32), page_table=pt)
    assert len(calls) == 2
    kc, vc = layers[1]
    check(w.run(q, (kc, vc)), kc, vc)
    assert len(calls) == 3
