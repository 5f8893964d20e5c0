#!/usr/bin/env python3
"""Fits where an MLA decode step's time goes per CTA, from a timeline with the
schedule (`KVA_DEC_TRACE=FILE kvattn bench --device cuda --mode mla ...`,
tools/dec_trace.c), and replays split schedules under that model.

  mla_cost_model.py TRACE                  fit: CTA end = a blocks + b chunks
                                           + c2 two-chunk merges + c3 merges
                                           of 3+ chunks + d partial writes + e
  mla_cost_model.py TRACE --sim S:O ...    also walk the batch of TRACE with
                                           the packed walk at slack S and chunk
                                           cost O (blocks), or with
                                           costed:C/P/M/MM/MG/H, the costed walk at
                                           those prices (1/16 blocks; slack 6),
                                           both from src/core/split_schedule.c
                                           built here with cc, and print each
                                           schedule's modelled max and mean

The fit uses the last traced launches (64-key blocks, 132 workers as traced).
A merge is the chunk of a split request that finishes last; the others write
partial rows. A merge is counted as one of 3+ chunks when the CTA holds a
chunk of such a request. Diagnostics only.
"""
import collections
import ctypes
import os
import subprocess
import sys
import tempfile

import numpy as np

from trace_records import load

BLOCK = 64


def blocks(k0, k1):
    return (k1 - k0 + BLOCK - 1) // BLOCK


def fit(sched, rows, workers):
    x, y = [], []
    for launch in sorted({r[0] for r in rows}):
        rr = [r for r in rows if r[0] == launch and r[12] > 0]
        t0 = min(r[3] for r in rr)
        for r in rr:
            ch = sched[r[1] % workers]
            merges = r[13]
            many = merges if any(c[4] >= 3 for c in ch) else 0
            partials = sum(1 for c in ch if c[4] > 1) - merges
            x.append([sum(blocks(c[1], c[2]) for c in ch), len(ch), merges - many, many, partials,
                      1])
            y.append((r[10] - t0) / 1000)
    x, y = np.array(x, float), np.array(y)
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    return coef, float(np.std(y - x @ coef))


class Work(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in ("begin_req", "begin_pos", "end_req", "end_pos",
                                             "begin_split")]


class Chunk(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in ("k0", "k1", "split")]


def schedule_lib():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    out = os.path.join(tempfile.mkdtemp(), "libsched.so")
    subprocess.check_call(["cc", "-O2", "-shared", "-fPIC", "-I" + os.path.join(root, "include"),
                           "-I" + os.path.join(root, "src"),
                           os.path.join(root, "src/core/split_schedule.c"), "-o", out])
    lib = ctypes.CDLL(out)
    lib.kva_split_work_chunk.restype = Chunk
    lib.kva_split_work_chunk.argtypes = [ctypes.POINTER(Work), ctypes.c_int, ctypes.c_int32]
    return lib


class Costs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in ("chunk", "partial", "merge", "merge_many", "margin",
                                             "min_head")]


def walk(lib, lens, workers, arg):
    """The packed walk ("S:O") or the costed walk ("costed:C/P/M/MM")."""
    n = len(lens)
    work = (Work * workers)()
    ind, order = (ctypes.c_int32 * (n + 1))(), (ctypes.c_int32 * n)()
    keys, nxt = (ctypes.c_int64 * (n + 1))(), (ctypes.c_int32 * (n + 1))()
    kv = (ctypes.c_int32 * n)(*lens)
    if arg.startswith("costed:"):
        c = Costs(*(int(v) for v in arg.split(":")[1].split("/")))
        lib.kva_split_schedule_costed(n, kv, BLOCK, workers, 6, ctypes.byref(c), work, ind, order,
                                      keys, nxt)
    else:
        slack, overhead = (int(v) for v in arg.split(":"))
        lib.kva_split_schedule_packed(n, kv, BLOCK, workers, slack, overhead, work, ind, order,
                                      keys, nxt)
    out = []
    for wk in work:
        ch = []
        for i in range(wk.begin_req, wk.end_req + 1):
            r = order[i]
            if ind[r + 1] == ind[r]:
                continue
            c = lib.kva_split_work_chunk(ctypes.byref(wk), i, lens[r])
            ch.append((r, c.k0, c.k1))
        out.append(ch)
    return out


def model(sched, coef):
    """Modelled end of each worker: its chunks in order, then who merges."""
    a, b, c2, c3, d, e = coef
    ends, load = collections.defaultdict(list), []
    for w, ch in enumerate(sched):
        t = e
        for r, k0, k1 in ch:
            t += a * blocks(k0, k1) + b
            ends[r].append((t, w))
        load.append(t)
    cuts = 0
    for r, l in ends.items():
        if len(l) < 2:
            continue
        l.sort()
        cuts += len(l) - 1
        for _, w in l[:-1]:
            load[w] += d
        load[l[-1][1]] += c2 if len(l) == 2 else c3
    return max(load), float(np.mean(load)), cuts


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sched, rows = load(sys.argv[1])
    workers = max(sched) + 1
    coef, sd = fit(sched, rows, workers)
    print("fit (us): %.2f/block %.2f/chunk %.2f/two-chunk merge %.2f/merge of 3+ "
          "%.2f/partial write + %.1f; residual sd %.2f" % (*coef, sd))
    if "--sim" not in sys.argv:
        return
    lens = collections.defaultdict(int)
    for ch in sched.values():
        for r, _, k1, _, _ in ch:
            lens[r] = max(lens[r], k1)
    lens = [lens[r] for r in sorted(lens)]
    lib = schedule_lib()
    for arg in sys.argv[sys.argv.index("--sim") + 1:]:
        mx, mean, cuts = model(walk(lib, lens, workers, arg), coef)
        print("%-22s max %.1f us, mean %.1f, max/mean %.3f, cuts %d"
              % (arg, mx, mean, mx / mean, cuts))


if __name__ == "__main__":
    main()
