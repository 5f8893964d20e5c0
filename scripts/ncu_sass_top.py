#!/usr/bin/env python3
"""Summary of `ncu -i REPORT --page source --print-source sass --csv` (stdin):
the SASS lines with the most warp-stall samples and the stall reasons that
dominate them, plus totals per reason.  python3 scripts/ncu_sass_top.py [N]"""
import csv
import sys

n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
rows = list(csv.reader(sys.stdin))
# the header is the first row holding "Source"
hi = next(i for i, r in enumerate(rows) if "Source" in r)
head, body = rows[hi], rows[hi + 1:]
col = {h: i for i, h in enumerate(head)}
samp = next(h for h in head if h.startswith("Warp Stall Sampling (All"))
reasons = [h for h in head if h.startswith("stall_") or "Stall" in h and h not in (samp,)
           and "Not-issued" not in h and "All" not in h]
def num(r, h):
    try:
        return float(r[col[h]].replace(",", ""))
    except (ValueError, IndexError):
        return 0.0
tot = sum(num(r, samp) for r in body)
print("columns:", ", ".join(head[:6]), "... reasons:", len(reasons))
totals = sorted(((sum(num(r, h) for r in body), h) for h in reasons), reverse=True)
print("total samples %.0f; by reason: %s" % (tot, "; ".join("%s %.1f%%" % (h, 100 * v / tot)
                                                           for v, h in totals[:12] if v > 0)))
top = sorted(body, key=lambda r: -num(r, samp))[:n]
for r in top:
    rs = sorted(((num(r, h), h) for h in reasons), reverse=True)[:3]
    print("%5.2f%% %s %-60s %s" % (100 * num(r, samp) / tot, r[col.get("Address", 0)],
                                   r[col["Source"]][:60],
                                   " ".join("%s:%.0f" % (h.replace("stall_", ""), v) for v, h in rs if v)))
