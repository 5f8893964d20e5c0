"""KvattnAttnBackend on the GPU: eager extend/decode, and decode captured in a
torch CUDA graph then replayed on smaller real batches (float64 reference)."""
import types

from gpu_util import attention, gpu, randn, rel_err, torch

import kvattn

pytestmark = gpu


def _layer(layer_id, hq, d):
    return types.SimpleNamespace(layer_id=layer_id, tp_q_head_num=hq, head_dim=d, scaling=None,
                                 logit_cap=0.0, sliding_window_size=-1)


def _check(pool, table, slots, q, o, hq, d, layer=0, n_new=1):
    at = 0
    for s in slots:
        k, v = pool.read_tokens(layer, table.tokens(s))
        ro, _ = attention(q[at:at + n_new].reshape(n_new, hq, d), torch.from_numpy(k).cuda(),
                          torch.from_numpy(v).cuda(), causal=True)
        assert rel_err(o[at:at + n_new].reshape(n_new, hq, d), ro) < 1e-2
        at += n_new


def test_eager_and_graph_decode():
    g = torch.Generator(device="cuda").manual_seed(9)
    hq, hk, d = 32, 8, 128
    pool = kvattn.Pool("cuda", num_layers=2, num_pages=512, page_size=16, num_kv_heads=hk,
                       head_dim=d, kv_dtype="bf16")
    table = kvattn.ReqTable(pool, 64, 4096)
    be = kvattn.KvattnAttnBackend(pool, table, hq)
    slots = [table.alloc() for _ in range(5)]
    prompt = [100, 7, 1500, 64, 1]
    for s, n in zip(slots, prompt):
        table.append(s, n)
    fb = types.SimpleNamespace(forward_mode="extend", req_pool_indices=torch.tensor(slots),
                               seq_lens=torch.tensor(prompt), extend_seq_lens=torch.tensor(prompt))
    be.init_forward_metadata(fb)
    T = sum(prompt)
    for layer in (0, 1):
        q = randn((T, hq * d), torch.bfloat16, g)
        k, v = randn((T, hk, d), torch.bfloat16, g), randn((T, hk, d), torch.bfloat16, g)
        be.forward_extend(q, k, v, _layer(layer, hq, d), fb)
    # graph: capture decode for 8 requests, replay on the 5 real ones, twice
    be.init_cuda_graph_state(8)
    static_q = torch.zeros((8, hq * d), dtype=torch.bfloat16, device="cuda")
    static_k = torch.zeros((8, hk, d), dtype=torch.bfloat16, device="cuda")
    static_v = torch.zeros_like(static_k)
    be.init_forward_metadata_capture_cuda_graph(8, 8, None, None, None, "decode")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside capture, as torch recommends
        be.forward_decode(static_q, static_k, static_v, _layer(0, hq, d), None)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_o = be.forward_decode(static_q, static_k, static_v, _layer(0, hq, d), None)
    for _ in range(2):
        for s in slots:
            table.append(s, 1)
        seq = torch.tensor([table.length(s) for s in slots], dtype=torch.int32)
        be.init_forward_metadata_replay_cuda_graph(5, torch.tensor(slots), seq, int(seq.sum()),
                                                   None, "decode", None, seq)
        static_q[:5].copy_(randn((5, hq * d), torch.bfloat16, g))
        static_k[:5].copy_(randn((5, hk, d), torch.bfloat16, g))
        static_v[:5].copy_(randn((5, hk, d), torch.bfloat16, g))
        static_o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert not static_o[:5].isnan().any()
        _check(pool, table, slots, static_q, static_o, hq, d)
