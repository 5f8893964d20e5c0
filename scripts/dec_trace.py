#!/usr/bin/env python3
"""Summarizes a decode timeline written by `KVA_DEC_TRACE=FILE kvattn bench
--device cuda --mode decode ...` (tools/dec_trace.c): where one step's time
goes between the previous kernel's end and this kernel's end.

usage: dec_trace.py FILE [FILE ...]   (one summary per file)
"""
import statistics
import sys


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * (len(xs) - 1) + 0.5))]


def summarize(path):
    rows = {0: [], 1: []}
    head = ""
    for line in open(path):
        if line.startswith("#"):
            head = line.strip()
            continue
        f = [int(x) for x in line.split()]
        rows[f[0]].append(dict(cta=f[1], entry=f[2], wait=f[3], tile0=f[4], loop=f[5],
                               partial=f[6], counted=f[7], fenced=f[8], merged=f[9], end=f[10],
                               sm=f[11], chunks=f[12], merges=f[13]))
    last, prev = rows[1], rows[0]
    work = [r for r in last if r["chunks"] > 0]
    if not work:
        print(f"{path}: no working CTA in the last launch")
        return
    base = min(r["wait"] for r in work)
    end = max(r["end"] for r in last)
    us = lambda ns: ns / 1e3
    print(f"{path}: {head}")
    print(f"  CTAs {len(last)} ({len(work)} with work), SMs {len(set(r['sm'] for r in last))}")
    if prev:
        pend = max(r["end"] for r in prev)
        print(f"  previous kernel end -> first wait return: {us(base - pend):7.2f} us"
              f"  (entries from {us(min(r['entry'] for r in last) - pend):+.2f} us)")
    span = end - base
    print(f"  span (first wait return -> last end):     {us(span):7.2f} us")
    w = [us(r["wait"] - base) for r in work]
    print(f"  wait returns after base: median {statistics.median(w):.2f} max {max(w):.2f} us")
    t0 = [us(r["tile0"] - r["wait"]) for r in work if r["tile0"]]
    if t0:
        print(f"  first tile landed after wait: min {min(t0):.2f} median {statistics.median(t0):.2f}"
              f" p90 {pct(t0, 0.9):.2f} max {max(t0):.2f} us")
    le = [us(r["loop"] - base) for r in work]
    print(f"  last key loop end: min {min(le):.2f} median {statistics.median(le):.2f}"
          f" p90 {pct(le, 0.9):.2f} max {max(le):.2f} us")
    ends = [us(r["end"] - base) for r in work]
    print(f"  CTA end: min {min(ends):.2f} median {statistics.median(ends):.2f}"
          f" max {max(ends):.2f} us")
    # the CTA that merged last: its epilogue step by step (stamps of its last merge)
    mc = [r for r in work if r["merges"] and r["merged"]]
    if mc:
        r = max(mc, key=lambda r: r["end"])
        print(f"  last merging CTA: loop end {us(r['loop'] - base):.2f}, partial written"
              f" +{us(r['partial'] - r['loop']):.2f}, counted +{us(r['counted'] - r['partial']):.2f},"
              f" fenced +{us(r['fenced'] - r['counted']):.2f}, merged +{us(r['merged'] - r['fenced']):.2f},"
              f" end +{us(r['end'] - r['merged']):.2f} us")
        mg = [us(r["merged"] - r["fenced"]) for r in mc]
        print(f"  merge loads+stores ({len(mc)} CTAs merged): median {statistics.median(mg):.2f}"
              f" max {max(mg):.2f} us")
    print(f"  tail after the last key loop: {us(end) - us(max(r['loop'] for r in work)):.2f} us")
    busy = sum(r["end"] - r["wait"] for r in work)
    print(f"  CTA occupancy of the span: {busy / (span * len(work)):.3f}")
    ch = [r["chunks"] for r in work]
    print(f"  chunks per CTA: min {min(ch)} max {max(ch)}; merges {sum(r['merges'] for r in work)}")


for p in sys.argv[1:]:
    summarize(p)
