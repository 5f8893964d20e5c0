#!/usr/bin/env python3
"""Phase sums of the prefill ws kernel (a build with -DKVA_EXT_TRACE; words
in src/cuda/extend_ws.cuh) from `KVA_DEC_TRACE=FILE kvattn bench --device
cuda --mode prefill ...`: per item, in microseconds, averaged over the CTAs
of the last launch:  python3 scripts/ext_trace.py FILE [label]"""
import sys

rows = []
for line in open(sys.argv[1]):
    if line.startswith("#"):
        continue
    f = [int(x) for x in line.split()]
    if f[0] == 1:  # the last launch
        rows.append(f[2:])
label = sys.argv[2] if len(sys.argv) > 2 else ""
if not rows:
    print(label, "no trace rows (not a KVA_EXT_TRACE build?)")
    sys.exit(0)
items = sum(r[7] for r in rows)
tiles = sum(r[8] for r in rows)
cyc = sum(r[9] for r in rows)
ns = sum(r[6] - r[0] for r in rows)
ghz = cyc / ns if ns else 1.0
span = (max(r[6] for r in rows) - min(r[0] for r in rows)) / 1e3
us = lambda w: sum(r[w] for r in rows) / ghz / 1e3 / max(items, 1)
busy = [(r[6] - r[0]) / 1e3 for r in rows]
print("%s ctas %d span %.1f us (cta %.1f-%.1f) %.2f GHz items/cta %.1f tiles/item %.1f" %
      (label, len(rows), span, min(busy), max(busy), ghz, items / len(rows), tiles / max(items, 1)))
print("%s per item us: qwait %.2f first %.2f mid %.2f lastpv %.2f epi %.2f | kvwait %.2f token %.2f"
      " | per tile mid %.3f" % (label, us(1), us(2), us(3), us(4), us(5), us(10), us(11),
                                us(3) * items / max(tiles - items, 1)))
