"""Records of the last launch in a `KVA_DEC_TRACE` file written by a
phase-trace build (tools/dec_trace.c), split into the two per-CTA halves:
a kernel whose two warpgroups each write one record puts the second one's
at (CTAs + cta). A CTA writes both or neither, so the lower half of the
sorted record indices is the first warpgroup's, whatever CTAs exited early.
Shared by ext_trace.py and mla_trace.py. Also the timeline of an MLA plan
(load, last_launch), for mla_cost_model.py, mla_merges.py and dec_tail.py."""
import collections
import sys


def load(path):
    """(sched, rows): sched[worker] = [(request, k0, k1, split, nsplit), ...]
    from the plan's "#w" lines; rows = one list of ints per CTA and launch
    (launch cta t_entry t_wait t_tile0 t_loop_end t_partial t_counted
    t_fenced t_merged t_end smid chunks merges)."""
    sched, rows = collections.defaultdict(list), []
    for line in open(path):
        if line.startswith("#w"):
            w, r, k0, k1, s, n = (int(x) for x in line.split()[1:])
            sched[w].append((r, k0, k1, s, n))
        elif not line.startswith("#"):
            rows.append([int(x) for x in line.split()])
    return sched, rows


def last_launch(rows):
    """The rows of load()'s last launch."""
    last = max(f[0] for f in rows)
    return [f for f in rows if f[0] == last]


def last_launch_halves(path):
    """(first warpgroup's records, second's), each a list of word lists;
    both empty when the file has no records."""
    recs = {}
    for line in open(path):
        if line.startswith("#"):
            continue
        f = [int(x) for x in line.split()]
        if f[0] == 1:  # the last launch
            recs[f[1]] = f[2:]
    keys = sorted(recs)
    half = len(keys) // 2
    return [recs[c] for c in keys[:half]], [recs[c] for c in keys[half:]]


def cli_halves(build_flag):
    """The halves of argv[1]'s last launch and the label argv[2] (or "");
    exits after a line naming build_flag when the file has no records."""
    halves = last_launch_halves(sys.argv[1])
    label = sys.argv[2] if len(sys.argv) > 2 else ""
    if not halves[0]:
        print(label, f"no trace rows (not a {build_flag} build?)")
        sys.exit(0)
    return halves, label
