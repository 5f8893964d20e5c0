"""FlashMLA-shaped API with torch on the GPU against float64. Needs the CUDA MLA
attention (branch mla-cuda); skips loudly while kvattn reports it unsupported."""
import pytest
from gpu_util import attention, gpu, poison_allocator, randn, rel_err, torch

import kvattn

pytestmark = gpu


@pytest.mark.parametrize("sq,causal,kvdt", [(1, False, "bfloat16"), (2, True, "bfloat16"),
                                            (1, False, "float8_e4m3fn")])
def test_flash_mla(sq, causal, kvdt):
    kvdt = getattr(torch, kvdt)
    g = torch.Generator(device="cuda").manual_seed(8)
    b, hq, ps, num_pages = 4, 128, 64, 200
    seq = torch.tensor([1 + sq, 4096, 513, 64], dtype=torch.int32, device="cuda")
    maxp = 64
    bt = torch.randperm(num_pages, generator=g, device="cuda")[:b * 40].to(torch.int32)
    bt = torch.cat([bt, bt[: b * maxp - b * 40]]).reshape(b, maxp)
    kc = (randn((num_pages, ps, 1, 576), torch.float32, g) * 0.5).to(kvdt)
    q = randn((b, sq, hq, 576), torch.bfloat16, g)
    meta, splits = kvattn.get_mla_metadata(seq, sq * hq, 1)
    assert meta.device == seq.device and meta.shape[1] == 8
    scale = 0.25 if kvdt == torch.float8_e4m3fn else None
    poison_allocator(b * sq * hq * 512 * 2 * 2)
    try:
        out, lse = kvattn.flash_mla_with_kvcache(q, kc, bt, seq, 512, meta, splits, causal=causal,
                                                 descale_k=scale)
    except kvattn.KvattnError as e:
        if e.status == "KVA_ERR_UNSUPPORTED":
            pytest.skip(f"SKIP: MLA attention not built in this libkvattn ({e.message})")
        raise
    torch.cuda.synchronize()
    assert not out.isnan().any() and lse.shape == (b, hq, sq)
    for r in range(b):
        n = int(seq[r])
        lat = kc.float()[bt[r].long()].flatten(0, 1)[:n] * (scale or 1.0)
        ro, rl = attention(q[r], lat, lat[..., :512], causal=causal, sm_scale=576 ** -0.5)
        assert rel_err(out[r], ro) < 1e-2
        assert (lse[r].double() - rl.T).abs().max() < 1e-3
