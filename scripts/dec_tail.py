#!/usr/bin/env python3
"""Where an MLA step's tail comes from, from decode timelines written by
`KVA_DEC_TRACE=FILE kvattn bench --device cuda --mode mla ...` (a
-DKVA_MLA6_TIMELINE build; scripts/dec_trace.py reads the same files).

usage: dec_tail.py FILE [FILE2]
  FILE: per kind of worker (its chunks as H head / R rest / W whole, split/of),
        the key loops' and CTAs' ends; then the step's end were the CTAs
        balanced in groups of 2 or 4 consecutive workers (as clusters could
        share work), at a cost of 0-4 us per balanced group, and balanced
        over all of them (the mean end).
  FILE2 (a second run of the same plan): how far each worker's loop end, less
        its kind's mean, repeats from run to run, by worker and by SM.
"""
import collections
import statistics as st
import sys

import trace_records


def load(path):
    plan, launch = trace_records.load(path)
    rows = {f[1]: f for f in trace_records.last_launch(launch)}
    base = min(r[3] for r in rows.values() if r[3])
    cta = {}
    for c, r in rows.items():
        ch = plan[c]
        kind = " + ".join(("H" if s == 0 and n > 1 else "W" if n == 1 else "R") + f"{s}/{n}"
                          for (_, _, _, s, n) in ch)
        blocks = sum((k1 - k0 + 63) // 64 for (_, k0, k1, _, _) in ch)
        cta[c] = dict(kind=kind, blocks=blocks, loop=(r[5] - base) / 1e3,
                      end=(r[10] - base) / 1e3, sm=r[11])
    return cta


def kinds(cta):
    g = collections.defaultdict(list)
    for c, v in cta.items():
        g[v["kind"]].append(v)
    print("  kind (chunks)                 n  blocks   loop end min/median/max   CTA end min/median/max (us)")
    for k, v in sorted(g.items(), key=lambda kv: -len(kv[1])):
        lo, en, bl = [x["loop"] for x in v], [x["end"] for x in v], [x["blocks"] for x in v]
        print(f"  {k:<28} {len(v):3d}  {min(bl):3d}-{max(bl):<3d}  {min(lo):6.1f} {st.median(lo):6.1f} {max(lo):6.1f}"
              f"    {min(en):6.1f} {st.median(en):6.1f} {max(en):6.1f}")


def balanced(cta):
    end = [cta[c]["end"] for c in sorted(cta)]
    top = max(end)
    print(f"  step end {top:.1f} us; were every CTA to end at the mean: {st.mean(end):.1f}"
          f" ({100 * (1 - st.mean(end) / top):.1f}% less)")
    for cost in (0, 2, 4):
        out = []
        for grp in (2, 4):
            new = [min(max(end[i:i + grp]), st.mean(end[i:i + grp]) + cost)
                   for i in range(0, len(end), grp)]
            out.append(f"groups of {grp}: {max(new):.1f} ({100 * (1 - max(new) / top):.1f}% less)")
        print(f"  balanced at {cost} us a group: " + ", ".join(out))


def repeat(a, b):
    def resid(cta):
        g = collections.defaultdict(list)
        for v in cta.values():
            g[v["kind"], v["blocks"]].append(v["loop"])
        return {c: (v["loop"] - st.mean(g[v["kind"], v["blocks"]]), v["sm"]) for c, v in cta.items()
                if len(g[v["kind"], v["blocks"]]) >= 4}

    def corr(x, y):
        mx, my = st.mean(x), st.mean(y)
        den = (sum((p - mx) ** 2 for p in x) * sum((q - my) ** 2 for q in y)) ** 0.5
        return sum((p - mx) * (q - my) for p, q in zip(x, y)) / den if den else 0.0

    ra, rb = resid(a), resid(b)
    cs = [c for c in ra if c in rb]
    print(f"  loop end less its kind's mean: sd {st.pstdev([ra[c][0] for c in cs]):.2f} and"
          f" {st.pstdev([rb[c][0] for c in cs]):.2f} us; run to run, by worker r ="
          f" {corr([ra[c][0] for c in cs], [rb[c][0] for c in cs]):.2f}", end="")
    sa, sb = {v[1]: v[0] for v in ra.values()}, {v[1]: v[0] for v in rb.values()}
    ss = [s for s in sa if s in sb]
    print(f", by SM r = {corr([sa[s] for s in ss], [sb[s] for s in ss]):.2f} ({len(ss)} SMs)")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    first = load(sys.argv[1])
    print(sys.argv[1])
    kinds(first)
    balanced(first)
    if len(sys.argv) > 2:
        repeat(first, load(sys.argv[2]))
