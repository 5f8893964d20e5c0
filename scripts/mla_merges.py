#!/usr/bin/env python3
"""The merging CTAs of an MLA decode timeline (`KVA_DEC_TRACE=FILE kvattn
bench --device cuda --mode mla ...`, tools/dec_trace.c), from the last
traced launch, ordered by their end: for each, the merges before the write
(word 2, v9's timeline build: `bash scripts/stage_device.sh
mla9timeline`), the key loop's end (us from the first PDL wait), the gaps
between the chunk-end stamps 4..7 (in a merge before the write: 4 merge
start, 5 the other chunk's rows landed, 6 folded, 7 O written; in a merge
from global memory: partial rows written, counted, -, merged), the CTA's
end, and its worker's chunks (request, split, chunks of that request).
    python3 scripts/mla_merges.py FILE"""
import sys

from trace_records import last_launch, load

sched, rows = load(sys.argv[1])
rows = last_launch(rows)
base = min(f[3] for f in rows if f[12] > 0)
workers = max(sched) + 1
cuts = sum(1 for w in sched for c in sched[w] if c[3] == 0 and c[4] > 1)
print("workers %d, requests cut %d" % (workers, cuts))
us = lambda a, b: (a - b) / 1e3
for f in sorted((f for f in rows if f[13] > 0), key=lambda f: f[10]):
    w = f[1] % workers
    print("cta %4d before-write %d loop %.1f  4:%+.2f 5:%+.2f 6:%+.2f 7:%+.2f end %.1f  %s" %
          (f[1], f[4], us(f[5], base), us(f[6], f[5]), us(f[7], f[6]), us(f[8], f[7]),
           us(f[9], f[8]), us(f[10], base), [(c[0], c[3], c[4]) for c in sched[w]]))
