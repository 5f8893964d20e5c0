"""FlashMLA-shaped API on the CPU against float64. Needs the C MLA attention
(branch mla-cpu); skips loudly while kvattn returns KVA_ERR_UNSUPPORTED for it."""
import numpy as np
import pytest
from ref import attention, randn, rel_err, tol

import kvattn


def _mla_or_skip(fn):
    try:
        return fn()
    except kvattn.KvattnError as e:
        if e.status == "KVA_ERR_UNSUPPORTED":
            pytest.skip(f"SKIP: MLA attention not built in this libkvattn ({e.message})")
        raise


def test_get_mla_metadata_is_the_split_schedule():
    seq = np.array([1, 700, 65, 4096], np.int32)
    meta, splits = kvattn.get_mla_metadata(seq, 16, 1)
    assert meta.dtype == np.int32 and meta.shape[1] == 8 and meta.shape[0] >= 1
    assert splits.shape == (5,) and splits[0] == 0 and np.all(np.diff(splits) >= 1)
    assert np.all(meta[:, 5:] == 0)
    # every (request, position) is covered by exactly one worker; the rows
    # walk the requests in the plan's order (longest first for MLA)
    meta2, splits2, order = kvattn.flashmla._schedule(seq, 16, 1)
    assert np.array_equal(meta, meta2) and np.array_equal(splits, splits2)
    assert sorted(order) == list(range(len(seq))) and seq[order[0]] == seq.max()
    cover = [np.zeros(n, int) for n in seq]
    for bi, bp, ei, ep, _bs, *_ in meta:
        for i in range(bi, ei + 1):
            r = order[i]
            lo = bp if i == bi else 0
            hi = ep if i == ei else seq[r]
            cover[r][lo:hi] += 1
    assert all(np.all(c == 1) for c in cover)
    with pytest.raises(ValueError):
        kvattn.get_mla_metadata(np.array([0, 3], np.int32), 16, 1)
    with pytest.raises(ValueError, match="one latent head"):
        kvattn.get_mla_metadata(seq, 16, 2)


@pytest.mark.parametrize("sq,causal", [(1, False), (3, True), (2, False)])
def test_flash_mla_with_kvcache(sq, causal):
    rng = np.random.default_rng(40 + sq)
    b, hq, ps, num_pages = 3, 16, 16, 40
    seq = np.array([5, 100, 33], np.int32)
    kc = randn(rng, (num_pages, ps, 1, 576), np.float16)
    maxp = int((seq.max() + ps - 1) // ps)
    bt = rng.permutation(num_pages)[: b * maxp].reshape(b, maxp).astype(np.int32)
    q = randn(rng, (b, sq, hq, 576))
    meta, splits = kvattn.get_mla_metadata(seq, sq * hq, 1)
    out, lse = _mla_or_skip(lambda: kvattn.flash_mla_with_kvcache(
        q, kc, bt, seq, 512, meta, splits, softmax_scale=0.05, causal=causal))
    assert out.shape == (b, sq, hq, 512) and lse.shape == (b, hq, sq)
    for r in range(b):
        lat = np.concatenate([kc[p, :, 0] for p in bt[r]])[: seq[r]][:, None, :]
        ro, rl = attention(q[r], lat, lat[..., :512], causal=causal, sm_scale=0.05)
        assert rel_err(out[r], ro) < tol(np.float32)
        np.testing.assert_allclose(lse[r], rl.T, atol=1e-4, rtol=0)


def test_flash_mla_errors():
    kc = np.ones((4, 16, 1, 576), np.float16)
    q = np.ones((1, 1, 16, 576), np.float32)
    bt = np.zeros((1, 1), np.int32)
    seq = np.array([4], np.int32)
    meta, splits = kvattn.get_mla_metadata(seq, 16, 1)
    f = kvattn.flash_mla_with_kvcache
    with pytest.raises(ValueError, match="head_dim_v"):
        f(q, kc, bt, seq, 256, meta, splits)
    with pytest.raises(ValueError, match="576"):
        f(np.ones((1, 1, 16, 512), np.float32), kc, bt, seq, 512, meta, splits)
    with pytest.raises(ValueError, match="s_q"):
        f(np.ones((1, 9, 16, 576), np.float32), kc, bt, np.array([20], np.int32), 512, meta, splits)
    with pytest.raises(ValueError, match="num_splits"):
        f(q, kc, bt, seq, 512, meta, np.zeros(5, np.int32))
    with pytest.raises(TypeError):
        f(q.astype(np.float64), kc, bt, seq, 512, meta, splits)
