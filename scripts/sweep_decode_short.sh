#!/bin/bash
# decode short-row sweep: workers x split-block
K=.dist/kvattn
c="--device cuda --mode decode --heads 32:8 --head-dim 128 --page 16 --dtype bf16 --json"
run() { "$K" bench $c "$@" | python3 -c "
import sys,json
for l in sys.stdin:
  j=json.loads(l); print('%-40s B=%d L=%d kv=%s w=%s blk=%s %.0f GB/s ratio %.3f single %.4f' % (' '.join(sys.argv[1:]), j['batch'], j['ctx'], j['kv_dtype'], j['workers'], j['split_block'], j['kv_gbps'], j['ratio'], j['single_ms']))
" "$@"; }
.dist/test_paged_plan | tail -2
for w in 0 16 24 33 40; do for b in 32 64 128; do run --kv-dtype bf16 --batch 1 --ctx 32768 --workers $w --split-block $b; done; done
for w in 0 24 33; do for b in 32 64 128; do run --kv-dtype bf16 --batch 64 --ctx 2048 --varlen --workers $w --split-block $b; done; done
for w in 0 24 33 40; do for b in 64 128 256; do run --kv-dtype fp8 --batch 1 --ctx 131072 --workers $w --split-block $b; done; done
run --kv-dtype bf16 --batch 1 --ctx 131072
