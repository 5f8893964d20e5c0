"""Short tables from the JSON lines scripts/device_run.sh leaves in a folder."""
import json
import os
import sys


def rows(path):
    if not os.path.exists(path):
        return []
    out = []
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def g(r, *keys, default=""):
    for k in keys:
        if k in r:
            return r[k]
    return default


d = sys.argv[1]
dec = rows(os.path.join(d, "bench_decode.jsonl"))
if dec:
    print("decode (GB/s of KV read; ratio to device copy measured in the same run)")
    print(f"{'B':>4} {'L':>7} {'var':>3} {'kv':>4} {'pg':>3} {'heads':>6} {'ms':>8} {'GB/s':>7} {'ratio':>6} {'Mtok/s':>8}")
    for r in dec:
        toks = g(r, "kv_tokens", default=0)
        mt = toks / (r["time_ms"] * 1e3) if toks else 0
        print(f"{g(r,'batch'):>4} {g(r,'ctx'):>7} {int(bool(g(r,'varlen',default=0))):>3} {g(r,'kv_dtype'):>4} "
              f"{g(r,'page'):>3} {g(r,'heads'):>6} {r['time_ms']:8.3f} {r['kv_gbps']:7.0f} {r['ratio']:6.3f} {mt:8.1f}")
tor = rows(os.path.join(d, "torch.jsonl"))
cud = {}
for r in tor:
    if r.get("baseline") == "cudnn" and "tflops" in r:
        cud[(r["seq"], r["head_dim"], r["heads"], bool(r["causal"]))] = r["tflops"]
    if r.get("baseline") == "d2d_copy":
        print(f"torch device copy: {r['gbps']:.0f} GB/s on {r.get('device')}")
pre = rows(os.path.join(d, "bench_prefill.jsonl"))
if pre:
    print("prefill (TFLOP/s, causal counted as half; vs torch cuDNN SDPA dense in the same call)")
    print(f"{'kernel':>6} {'mode':>7} {'B':>3} {'S':>6} {'heads':>6} {'d':>4} {'causal':>6} {'ms':>8} {'TFLOP/s':>8} {'cuDNN':>7} {'x':>6}")
    for r in pre:
        key = (g(r, "ctx"), g(r, "head_dim"), g(r, "heads"), bool(g(r, "causal", default=1)))
        c = cud.get(key) if g(r, "mode") != "mixed" else None
        x = f"{r['tflops']/c:6.2f}" if c else "     -"
        print(f"{g(r,'kernel'):>6} {g(r,'mode'):>7} {g(r,'batch'):>3} {g(r,'ctx'):>6} {g(r,'heads'):>6} {g(r,'head_dim'):>4} {int(bool(g(r,'causal',default=1))):>6} "
              f"{r['time_ms']:8.3f} {r['tflops']:8.1f} {(c or 0):7.1f} {x}")
