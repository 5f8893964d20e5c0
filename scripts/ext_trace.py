#!/usr/bin/env python3
"""Phase sums of the prefill ws kernel (a build with -DKVA_EXT_TRACE; words
in src/cuda/extend_ws.cuh) from `KVA_DEC_TRACE=FILE kvattn bench --device
cuda --mode prefill ...`, per consumer warpgroup, averaged over the CTAs of
the last launch: per item (Q wait, epilogue) and per key tile after an
item's first (issue + S wait, softmax, P V wait, K/V wait, token wait), in
microseconds at the clock the cycle counts imply.
    python3 scripts/ext_trace.py FILE [label]"""
from trace_records import cli_halves

halves, label = cli_halves("KVA_EXT_TRACE")  # consumer 1 writes record grid + cta
for cw in (0, 1):
    rows = halves[cw]
    items = sum(r[7] for r in rows)
    tiles = sum(r[8] for r in rows)
    cyc = sum(r[9] for r in rows)
    ns = sum(r[6] - r[0] for r in rows)
    ghz = cyc / ns if ns else 1.0
    us = lambda w: sum(r[w] for r in rows) / ghz / 1e3
    mid = max(tiles - items, 1)
    busy = [(r[6] - r[0]) / 1e3 for r in rows]
    if cw == 0:
        print("%s ctas %d busy %.1f-%.1f us %.2f GHz items/cta %.1f tiles/item %.1f" %
              (label, len(rows), min(busy), max(busy), ghz, items / len(rows), tiles / max(items, 1)))
    print("%s wg%d per item: qwait %.2f epi %.2f | per tile (ns): issue+S %.0f softmax %.0f pv %.0f"
          " kv %.0f token %.0f = %.0f" % (label, cw, us(1) / max(items, 1), us(5) / max(items, 1),
                                         1e3 * us(2) / mid, 1e3 * us(3) / mid, 1e3 * us(4) / mid,
                                         1e3 * us(10) / mid, 1e3 * us(11) / mid,
                                         1e3 * (us(2) + us(3) + us(4) + us(10) + us(11)) / mid))
