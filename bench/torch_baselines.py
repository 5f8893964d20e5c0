"""Dense (unpaged) attention baselines in PyTorch, measured in the same device
call as kvattn's benchmarks: cuDNN and FA2 SDPA prefill, and a device copy.
Prints one JSON object per line."""
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def bench(fn, iters=20, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def bench_sustained(fn, warm_ms, samples):
    """As `kvattn bench --warm-ms`: launches back to back for warm_ms, then
    the median of `samples` samples of ~1 ms of back-to-back launches each
    (per-launch time), so that both sides are timed at the clock the GPU
    holds under sustained load (its power cap)."""
    import time
    fn()
    torch.cuda.synchronize()
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < warm_ms * 1e-3:
        fn()
        n += 1
        if n % 16 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    single = bench(fn, iters=20, warmup=0)
    reps = max(1, min(50, int(1.0 / max(single, 1e-4) + 0.999)))
    times = []
    for _ in range(samples):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / reps)
    times.sort()
    return times[len(times) // 2]


def prefill_row(b, s, heads, kv_heads, d, causal, warm_ms, samples):
    """One prefill row on cuDNN, sustained (bench_sustained)."""
    q = torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, kv_heads, s, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, kv_heads, s, d, device="cuda", dtype=torch.bfloat16)
    flops = 4.0 * b * heads * s * s * d * (0.5 if causal else 1.0)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ms = bench_sustained(lambda: F.scaled_dot_product_attention(
            q, k, v, is_causal=causal, enable_gqa=(kv_heads != heads)), warm_ms, samples)
    print(json.dumps({"baseline": "cudnn", "mode": "prefill", "batch": b, "seq": s,
                      "heads": f"{heads}:{kv_heads}", "head_dim": d, "causal": causal,
                      "warm_ms": warm_ms, "time_ms": ms, "tflops": flops / ms / 1e9}), flush=True)


def copy_ceiling():
    n = 1 << 30
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    return 2 * n / ms / 1e6  # GB/s read + write


def prefill(total_tokens=16384, heads=16, kv_heads=16, d=128, causal=True):
    for s in [512, 1024, 2048, 4096, 8192, 16384]:
        b = max(1, total_tokens // s)
        q = torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, kv_heads, s, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, kv_heads, s, d, device="cuda", dtype=torch.bfloat16)
        flops = 4.0 * b * heads * s * s * d * (0.5 if causal else 1.0)
        for name, be in [("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)]:
            try:
                with sdpa_kernel(be):
                    ms = bench(lambda: F.scaled_dot_product_attention(
                        q, k, v, is_causal=causal, enable_gqa=(kv_heads != heads)))
                print(json.dumps({"baseline": name, "mode": "prefill", "batch": b, "seq": s,
                                  "heads": f"{heads}:{kv_heads}", "head_dim": d, "causal": causal,
                                  "time_ms": ms, "tflops": flops / ms / 1e9}), flush=True)
            except Exception as e:  # a backend may refuse a shape
                print(json.dumps({"baseline": name, "mode": "prefill", "seq": s, "head_dim": d,
                                  "error": str(e)[:200]}), flush=True)


if __name__ == "__main__":
    torch.manual_seed(0)
    if sys.argv[1:2] == ["row"]:  # row B S HQ HKV D CAUSAL WARM_MS SAMPLES (scripts/prefill_sustained.sh)
        b, s, hq, hkv, d, c, w, n = (int(x) for x in sys.argv[2:10])
        prefill_row(b, s, hq, hkv, d, bool(c), w, n)
        sys.exit(0)
    print(json.dumps({"baseline": "d2d_copy", "gbps": copy_ceiling(),
                      "device": torch.cuda.get_device_name()}), flush=True)
    which = sys.argv[1:] or ["prefill"]
    if "prefill" in which:
        prefill()
        prefill(causal=False)
        prefill(d=64)
        prefill(d=256)
        prefill(heads=32, kv_heads=8)
    if "noncausal" in which:  # d=128 without a mask, MHA and GQA (scripts/ab_prefill.sh's rows)
        prefill(causal=False)
        prefill(heads=32, kv_heads=8, causal=False)
