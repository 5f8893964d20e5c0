#!/usr/bin/env python3
"""Where MLA v10's block time goes: reads the KVA_DEC_TRACE file of a
`kvattn bench --mode mla` run built with -DKVA_MLA10_PHASES (each CTA's
cycles per phase summed over its blocks; see mla_kernel_v10.cuh) and prints
the cycles a block of each phase, over the last launch's CTAs. With two
S warpgroups (the default since the thirty-fifth session) the blocks are
S warpgroup 0's, half of the CTA's: its rows are per block of its own,
and the O rows per two blocks.
  python3 scripts/mla10_phases.py TRACE_FILE [TRACE_FILE ...]"""
import sys

NAMES = [
    (0, "wg0: bytes wait"),
    (1, "wg0: S^T conversion + issue"),
    (2, "wg0: S^T wait"),
    (3, "wg0: block max + barrier"),
    (4, "wg0: P^T buffer wait"),
    (5, "wg0: P^T written"),
    (6, "O:   bytes wait"),
    (7, "O:   P^T wait"),
    (8, "O:   rescale + O^T issue"),
    (9, "O:   O^T wait"),
    (10, "O:   refill"),
]


def read(path):
    sums, ctas = [0] * 12, 0
    for line in open(path):
        if line.startswith("#"):
            continue
        f = line.split()
        if len(f) < 14 or f[0] != "1":  # the last launch only
            continue
        w = [int(x) for x in f[2:14]]
        if w[11] == 0:
            continue
        ctas += 1
        for k in range(12):
            sums[k] += w[k]
    return sums, ctas


for path in sys.argv[1:]:
    sums, ctas = read(path)
    if not ctas:
        print(f"{path}: no v10 records")
        continue
    blocks = sums[11]
    print(f"{path}: {ctas} CTAs, {blocks} blocks ({blocks / ctas:.1f} a CTA); cycles a block:")
    for k, name in NAMES:
        print(f"  {name:30s} {sums[k] / blocks:8.0f}")
    print(f"  {'wg0 total':30s} {sum(sums[0:6]) / blocks:8.0f}")
    print(f"  {'O total':30s} {sum(sums[6:11]) / blocks:8.0f}")
