"""Table of an A/B script (scripts/ab_decode.sh, ab_fp8.sh, ab_mla.sh, ab_prefill.sh) from
the `kvattn bench --json` lines on stdin, each tagged by the script with
"bin" (the build's file name) or, for MLA, "kernel" (v2/v5, or the A/B name):
    ... | python3 scripts/ab_summary.py decode|fp8|mla
decode: every sample per row, sorted (the spread shows what a difference
is worth); fp8: median fp8 vs bf16 time per build and shape; mla: median
per kernel and shape, with the other numbers of the sample nearest it;
prefill: every TFLOP/s sample per shape and variant ("kernel"), sorted."""
import collections
import json
import statistics
import sys


def groups(key):
    """The stdin rows grouped by key(row), in input order within a group."""
    d = collections.defaultdict(list)
    for line in sys.stdin:
        r = json.loads(line)
        d[key(r)].append(r)
    return d


def decode():
    d = groups(lambda r: (r["batch"], r["ctx"], r["varlen"], r["kv_dtype"], r["heads"],
                          r.get("sq", 1), r["bin"]))
    for k in sorted(d):
        ts = sorted(r["time_ms"] for r in d[k])
        rs = sorted(r["ratio"] for r in d[k])
        extra = ("" if k[4] == "32:8" else " " + k[4]) + ("" if k[5] == 1 else " sq=%d" % k[5])
        print("B=%d L=%d var=%d %s%s %-10s ms %s ratio %s" % (k[0], k[1], k[2], k[3], extra, k[6],
              " ".join("%.4f" % t for t in ts), " ".join("%.3f" % x for x in rs)))


def fp8():
    d = groups(lambda r: (r["bin"], r["batch"], r["ctx"], r["kv_dtype"]))

    def med(k):
        return statistics.median(r["time_ms"] for r in d[k])

    for (b, B, L, _) in sorted(k for k in d if k[3] == "fp8"):
        t8, t16 = med((b, B, L, "fp8")), med((b, B, L, "bf16"))
        print("%-10s B=%-3d L=%-6d fp8 %.4f ms  bf16 %.4f ms  fp8 tokens/s = %.3fx bf16" % (
            b, B, L, t8, t16, t16 / t8))


def mla():
    d = groups(lambda r: (r["sq"], int(r["heads"].split(":")[0]), r["ctx"], r["varlen"],
                          r["kv_dtype"], r["kernel"]))
    for k in sorted(d):
        rs = d[k]
        t = statistics.median(x["time_ms"] for x in rs)
        r = min(rs, key=lambda x: abs(x["time_ms"] - t))
        print("sq=%d h=%-3d sk=%-5d var=%d %-4s %s %.4f ms %5.0f GB/s ratio %.3f %6.1f TFLOP/s [%s]" % (
            k[0], k[1], k[2], k[3], k[4], k[5], t, r["kv_gbps"], r["ratio"], r["tflops"], r["bound"]))


def prefill():
    d = groups(lambda r: (r.get("mode", "prefill"), int(r["heads"].split(":")[0]),
                          int(r["heads"].split(":")[1]), r["head_dim"], r["causal"], r["ctx"],
                          r["batch"], r["kernel"]))
    for k in sorted(d):
        fs = sorted(r["tflops"] for r in d[k])
        print("%-7s %d:%d d=%-3d causal=%d S=%-5d B=%-2d %-6s TFLOP/s %s" % (
            k + (" ".join("%.1f" % f for f in fs),)))


TABLES = {"decode": decode, "fp8": fp8, "mla": mla, "prefill": prefill}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in TABLES:
        sys.exit("usage: python3 scripts/ab_summary.py decode|fp8|mla|prefill < bench.jsonl")
    TABLES[sys.argv[1]]()
