#!/usr/bin/env python3
"""Compare the kernels of two cubins (ELF) word by word, without cuobjdump.

    nvcc ... -gencode=arch=compute_90a,code=sm_90a -O3 -cubin src/cuda/mla.cu -o a.cubin
    (change the code, build b.cubin the same way)
    python3 scripts/cubin_diff.py a.cubin b.cubin [kernel-name-substring]

Prints, per kernel (.text section) that differs, how many 16-byte
instruction words differ; with a name substring, the differing words'
offsets and bytes. Same size and few differing words: a reorder or a
register choice; most words differing at the same size: code shifted."""
import struct
import sys


def sections(path):
    b = open(path, 'rb').read()
    shoff, = struct.unpack_from('<Q', b, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', b, 0x3A)
    hdrs = [struct.unpack_from('<IIQQQQIIQQ', b, shoff + i * shentsize) for i in range(shnum)]
    stro = hdrs[shstrndx][4]
    out = {}
    for h in hdrs:
        name = b[stro + h[0]: b.index(b'\0', stro + h[0])].decode()
        if name.startswith('.text.'):
            out[name[6:]] = b[h[4]:h[4] + h[5]]
    return out


def main():
    a, b = sections(sys.argv[1]), sections(sys.argv[2])
    for n in sorted(set(a) | set(b)):
        if n not in a or n not in b:
            print('only in one:', n)
        elif a[n] != b[n]:
            x, y = a[n], b[n]
            if len(x) != len(y):
                print(n, 'size', len(x), '->', len(y))
                continue
            nd = sum(1 for i in range(0, len(x), 16) if x[i:i + 16] != y[i:i + 16])
            print(n, 'differing words', nd, 'of', len(x) // 16)
        else:
            print(n, 'identical')
    if len(sys.argv) > 3:
        for n in sorted(a):
            if sys.argv[3] in n and n in b and len(a[n]) == len(b[n]):
                for i in range(0, len(a[n]), 16):
                    if a[n][i:i + 16] != b[n][i:i + 16]:
                        print(n[:40], hex(i), a[n][i:i + 16].hex(), b[n][i:i + 16].hex())


if __name__ == '__main__':
    main()
