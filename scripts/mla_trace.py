#!/usr/bin/env python3
"""Phase sums of MLA kernel v5 (a build with -DKVA_MLA_TRACE; words in
src/cuda/mla_kernel_v5.cuh) from `KVA_DEC_TRACE=FILE kvattn bench --device
cuda --mode mla ...` (with KVA_MLA_KERNEL=v5: v6, the default from 128
rows, writes no trace records), per warpgroup, averaged over the CTAs of the last
launch: per pair of 64-key blocks, in cycles, and the share of the key
loop each phase takes.
    python3 scripts/mla_trace.py FILE [label]"""
from trace_records import cli_halves

halves, label = cli_halves("KVA_MLA_TRACE")  # warpgroup 1 writes record CTAs + cta
names = [(1, "S data"), (2, "S wait"), (3, "softmax"), (4, "handover"), (5, "PV wait"),
         (8, "refill")]
for wg in (0, 1):
    rows = halves[wg]
    if not rows:
        continue
    pairs = sum(r[7] for r in rows)
    loop = sum(r[10] for r in rows)
    cyc = sum(r[9] for r in rows)
    ns = sum(r[6] - r[0] for r in rows)
    ghz = cyc / ns if ns else 1.0
    epi = sum(r[11] for r in rows)
    if wg == 0:
        print("%s ctas %d %.2f GHz pairs/cta %.1f loop %.0f%% of cycles, epilogue %.0f%%" %
              (label, len(rows), ghz, pairs / len(rows), 100.0 * loop / max(cyc, 1),
               100.0 * epi / max(cyc, 1)))
    per = lambda w: sum(r[w] for r in rows) / max(pairs, 1)
    parts = " ".join("%s %.0f" % (nm, per(w)) for w, nm in names)
    acc = sum(per(w) for w, _ in names)
    print("%s wg%d cycles/pair %.0f: %s | other %.0f" % (label, wg, loop / max(pairs, 1), parts,
                                                        loop / max(pairs, 1) - acc))
