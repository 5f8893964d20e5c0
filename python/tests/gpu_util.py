"""Shared by the GPU tests: the skip rule, a float64 torch reference, NaN poisoning."""
import pytest

import kvattn

try:
    import torch
except ImportError:  # pragma: no cover - the CI machine
    torch = None


def _skip_reason():
    if torch is None:
        return "SKIP: GPU tests need torch (not installed)"
    if not torch.cuda.is_available():
        return "SKIP: GPU tests need a CUDA device (torch sees none)"
    if not kvattn.device_available("cuda"):
        return ("SKIP: GPU tests need a CUDA build of libkvattn (" + kvattn.library_path +
                " has no usable CUDA backend; set KVATTN_LIBRARY)")
    return None


REASON = _skip_reason()
gpu = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def attention(q, k, v, *, causal, sm_scale=None, window_left=-1, softcap=0.0):
    """float64 torch reference: q [sq, hq, d], k/v [sk, hk, d*] -> o [sq, hq, dv], lse [sq, hq]."""
    q, k, v = (x.to(torch.float64) for x in (q, k, v))
    sq, hq, d = q.shape
    sk, hk = k.shape[:2]
    scale = sm_scale if sm_scale else d ** -0.5
    k = k.repeat_interleave(hq // hk, dim=1)
    v = v.repeat_interleave(hq // hk, dim=1)
    x = torch.einsum("qhd,khd->hqk", q, k) * scale
    if softcap:
        x = softcap * torch.tanh(x / softcap)
    pos = sk - sq + torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        mask &= j <= pos
    if window_left >= 0:
        mask &= j >= pos - window_left
    x = x.masked_fill(~mask[None], float("-inf"))
    lse = torch.logsumexp(x, dim=-1)
    o = torch.einsum("hqk,khd->qhd", torch.softmax(x, dim=-1), v)
    return o, lse.T


def rel_err(a, ref):
    a, ref = a.to(torch.float64), ref.to(torch.float64)
    return float((a - ref).norm() / ref.norm().clamp_min(1e-30))


def randn(shape, dtype, gen=None):
    x = torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32)
    x = torch.where(x.abs() < 1e-3, torch.full_like(x, 0.5), x)
    return x.to(dtype)


def poison_allocator(nbytes):
    """Fills a freed block of the caching allocator with NaN so outputs the library
    allocates are likely to start as NaN (APIs without an out= argument)."""
    x = torch.full((nbytes // 4 + 1024,), float("nan"), device="cuda")
    del x


def nan_like(shape, dtype):
    return torch.full(shape, float("nan"), device="cuda", dtype=dtype)


def tol(dtype):
    return 2e-5 if dtype == torch.float32 else 1e-2
