#!/usr/bin/env python3
"""A CTA's first chunk end in an MLA v9 probe timeline: a build with
-DKVA_MLA9_PHASES (bash scripts/stage_device.sh mla9phases -> .dist/kvattn_mla9ph),
then KVA_DEC_TRACE=F .dist/kvattn_mla9ph bench --device cuda --mode mla ...;
python3 scripts/mla9_phases.py F. Per launch, quantiles over the working CTAs
(words: mla_kernel_v9.cuh, KVA_MLA9_PHASES)."""
import sys, collections
rows = [list(map(int, l.split())) for l in open(sys.argv[1]) if l.strip() and not l.startswith('#')]
by = collections.defaultdict(list)
for r in rows:
    w = r[2:]
    if w[1] == 0 or w[3] == 0: continue
    by[r[0]].append(w)
def q(v):
    v = sorted(v); n = len(v)
    return '%7.2f %7.2f %7.2f %7.2f' % (v[0], v[n // 2], v[(9 * n) // 10], v[-1])
for L, rs in sorted(by.items()):
    print('launch %d: %d CTAs (min median p90 max, us)' % (L, len(rs)))
    two = [w for w in rs if w[0] and w[10] and w[11]]
    for name, a, b, sel in [('ramp: wait -> c0 PV0', 1, 2, rs), ('c0 loop', 2, 3, rs),
                            ('loop end -> stats read', 3, 4, rs), ('stats -> merge check', 4, 5, rs),
                            ('merge check -> O stored', 5, 6, rs), ('O stored -> fenced', 6, 7, rs),
                            ('loop end -> c1 Q landed', 3, 11, two), ('loop end -> c1 S0 issued', 3, 10, two),
                            ('fenced -> c1 PV0', 7, 0, two), ('loop end -> c1 PV0', 3, 0, two),
                            ('c1 PV0 -> exit', 0, 8, two)]:
        v = [(w[b] - w[a]) / 1e3 for w in sel]
        if v: print('  %-26s %s' % (name, q(v)))
