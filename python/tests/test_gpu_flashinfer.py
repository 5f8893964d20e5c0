"""FlashInfer-shaped wrappers and merge_state with torch on the GPU against float64."""
import math

import pytest
from gpu_util import attention, gpu, nan_like, randn, rel_err, tol, torch

import kvattn

pytestmark = gpu


def _ragged(kv_lens, ps, num_pages, g):
    pages = torch.randperm(num_pages, generator=g, device="cuda").to(torch.int32)
    indptr, last, at = [0], [], 0
    for n in kv_lens:
        at += (n + ps - 1) // ps
        indptr.append(at)
        last.append(n - ((n + ps - 1) // ps - 1) * ps)
    return (torch.tensor(indptr, dtype=torch.int32, device="cuda"), pages[:at].contiguous(),
            torch.tensor(last, dtype=torch.int32, device="cuda"))


def _kv(cache, indptr, indices, r, n):
    return cache.float()[indices[indptr[r]:indptr[r + 1]].long()].flatten(0, 1)[:n]


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
def test_decode(interleaved, dt):
    dt = getattr(torch, dt)
    g = torch.Generator(device="cuda").manual_seed(5)
    ps, hq, hk, d, num_pages = 16, 32, 8, 128, 300
    kv_lens = [1, 16, 17, 900, 2048, 333]
    indptr, indices, last = _ragged(kv_lens, ps, num_pages, g)
    if interleaved:
        kv = randn((num_pages, 2, ps, hk, d), dt, g)
        cache, kc, vc = kv, kv[:, 0], kv[:, 1]
    else:
        kc, vc = randn((num_pages, ps, hk, d), dt, g), randn((num_pages, ps, hk, d), dt, g)
        cache = (kc, vc)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(indptr, indices, last, hq, hk, d, ps, q_data_type=dt)
    q = randn((len(kv_lens), hq, d), dt, g)
    out, lse = nan_like(q.shape, dt), nan_like(q.shape[:2], torch.float32)
    w.run(q, cache, out=out, lse=lse, return_lse=True)
    torch.cuda.synchronize()
    for r, n in enumerate(kv_lens):
        ro, rl = attention(q[r:r + 1], _kv(kc, indptr, indices, r, n), _kv(vc, indptr, indices, r, n),
                           causal=True)
        assert rel_err(out[r], ro[0]) < tol(dt)
        assert (lse[r].double() - rl[0] / math.log(2)).abs().max() < 1e-3


def test_prefill_causal():
    g = torch.Generator(device="cuda").manual_seed(6)
    ps, hq, hk, d, num_pages = 64, 16, 4, 128, 100
    kv_lens, q_lens = [300, 1000, 129], [300, 256, 1]
    indptr, indices, last = _ragged(kv_lens, ps, num_pages, g)
    qo = torch.tensor([0, 300, 556, 557], dtype=torch.int32, device="cuda")
    kc, vc = randn((num_pages, ps, hk, d), torch.bfloat16, g), randn((num_pages, ps, hk, d), torch.bfloat16, g)
    w = kvattn.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
    w.plan(qo, indptr, indices, last, hq, hk, d, ps, causal=True)
    q = randn((557, hq, d), torch.bfloat16, g)
    out = nan_like(q.shape, torch.bfloat16)
    w.run(q, (kc, vc), out=out)
    torch.cuda.synchronize()
    for r in range(3):
        lo, hi = int(qo[r]), int(qo[r + 1])
        ro, _ = attention(q[lo:hi], _kv(kc, indptr, indices, r, kv_lens[r]),
                          _kv(vc, indptr, indices, r, kv_lens[r]), causal=True)
        assert rel_err(out[lo:hi], ro) < 1e-2


def test_merge_state():
    g = torch.Generator(device="cuda").manual_seed(7)
    va, vb = randn((100, 8, 128), torch.bfloat16, g), randn((100, 8, 128), torch.bfloat16, g)
    sa, sb = randn((100, 8), torch.float32, g) * 3, randn((100, 8), torch.float32, g) * 3
    v, s = kvattn.merge_state(va, sa, vb, sb)
    torch.cuda.synchronize()
    wa, wb = torch.exp2(sa.double()), torch.exp2(sb.double())
    ref = (va.double() * wa[..., None] + vb.double() * wb[..., None]) / (wa + wb)[..., None]
    assert rel_err(v, ref) < 1e-2
    assert (s.double() - torch.log2(wa + wb)).abs().max() < 1e-4
