"""Records of the last launch in a `KVA_DEC_TRACE` file written by a
phase-trace build (tools/dec_trace.c), split into the two per-CTA halves:
a kernel whose two warpgroups each write one record puts the second one's
at (CTAs + cta). A CTA writes both or neither, so the lower half of the
sorted record indices is the first warpgroup's, whatever CTAs exited early.
Shared by ext_trace.py and mla_trace.py."""
import sys


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
