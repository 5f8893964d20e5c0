"""float64 numpy reference attention and random data helpers for the tests."""
import numpy as np


def attention(q, k, v, *, causal, sm_scale=None, window_left=-1, softcap=0.0):
    """q [sq, hq, d], k [sk, hk, d], v [sk, hk, dv] -> o [sq, hq, dv], lse [sq, hq] (natural).
    Query t sits at position sk - sq + t (bottom-right aligned)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    sq, hq, d = q.shape
    sk, hk = k.shape[:2]
    scale = sm_scale if sm_scale else 1.0 / np.sqrt(d)
    kh = np.repeat(k, hq // hk, axis=1)
    vh = np.repeat(v, hq // hk, axis=1)
    x = np.einsum("qhd,khd->hqk", q, kh) * scale
    if softcap:
        x = softcap * np.tanh(x / softcap)
    pos = sk - sq + np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    mask = np.ones((sq, sk), bool)
    if causal:
        mask &= j <= pos
    if window_left >= 0:
        mask &= j >= pos - window_left
    x = np.where(mask[None], x, -np.inf)
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(x - m)
    s = p.sum(-1, keepdims=True)
    o = np.einsum("hqk,khd->qhd", p / np.where(s > 0, s, 1.0), vh)
    lse = (np.log(s) + m)[..., 0].T
    return o, lse


def rel_err(a, ref):
    a = np.asarray(a, np.float64)
    ref = np.asarray(ref, np.float64)
    return float(np.linalg.norm(a - ref) / max(np.linalg.norm(ref), 1e-30))


def randn(rng, shape, dtype=np.float32):
    """Random, never zero."""
    x = rng.standard_normal(shape)
    x = np.where(np.abs(x) < 1e-3, 0.5, x)
    return x.astype(dtype)


def tol(dtype):
    return 2e-5 if np.dtype(dtype) == np.float32 else 1e-2


def lse_tol(dtype):
    return 1e-5 if np.dtype(dtype) == np.float32 else 1e-4
