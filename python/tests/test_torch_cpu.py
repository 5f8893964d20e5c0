"""torch tensors on the CPU (bf16 and fp8 need torch; numpy has neither).
Skips loudly without torch."""
import numpy as np
import pytest
from ref import attention, rel_err

import kvattn

torch = pytest.importorskip("torch", reason="SKIP: torch CPU tests need torch (not installed)")


@pytest.mark.parametrize("kvdt", ["bfloat16", "float8_e4m3fn"])
def test_fa3_torch_cpu(kvdt):
    kvdt = getattr(torch, kvdt)
    g = torch.Generator().manual_seed(0)
    kc = (torch.randn(16, 16, 2, 64, generator=g) + 0.01).to(kvdt)
    vc = (torch.randn(16, 16, 2, 64, generator=g) + 0.01).to(kvdt)
    q = torch.randn(2, 2, 4, 64, generator=g).to(torch.bfloat16)
    pt = torch.tensor([[3, 5, 7], [1, 0, 2]], dtype=torch.int32)
    seq = torch.tensor([40, 17], dtype=torch.int32)
    scale = 0.5 if kvdt == torch.float8_e4m3fn else None
    out = kvattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seq, page_table=pt, causal=True,
                                         k_descale=scale, v_descale=scale)
    assert out.dtype == torch.bfloat16 and isinstance(out, torch.Tensor)
    for b in range(2):
        n = int(seq[b])
        kk = kc.float()[pt[b].long()].flatten(0, 1)[:n].numpy() * (scale or 1.0)
        vv = vc.float()[pt[b].long()].flatten(0, 1)[:n].numpy() * (scale or 1.0)
        ro, _ = attention(q[b].float().numpy(), kk, vv, causal=True)
        assert rel_err(out[b].float().numpy(), ro) < 1e-2
    assert not np.isnan(out.float().numpy()).any()
