"""A forward pass written once against PyTorch's API (a convolution, pooling, a linear
layer with GELU, layer norm, a cross entropy with label smoothing, causal attention,
softmax, reductions along dims, argmax) runs on eagervm by changing the imports, and
agrees with PyTorch's. Needs PyTorch's CPU wheel; skipped where it does not install."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as TF  # noqa: E402

import eagervm.nn.functional as EF  # noqa: E402


def forward(F, x, w1, b1, w2, b2, cw, target, q, k, v):
    h = F.conv2d(x, cw, padding=1).relu()
    h = F.max_pool2d(h, 2).flatten(1)
    h = F.layer_norm(F.gelu(F.linear(h, w1, b1)), (w1.shape[0],))
    logits = F.linear(h, w2, b2)
    loss = F.cross_entropy(logits, target, label_smoothing=0.1)
    att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return loss, att.softmax(dim=-1).sum(dim=(0, 2)), logits.argmax(dim=1), logits.max(dim=0).values


def test_a_pytorch_forward_pass_ports_by_its_imports(vm, device):
    rng = np.random.default_rng(0)
    shapes = [(8, 1, 8, 8), (32, 64), (32,), (10, 32), (10,), (4, 1, 3, 3)]
    floats = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    target = rng.integers(0, 10, size=(8,)).astype(np.int64)
    qkv = [rng.standard_normal((2, 4, 16, 8)).astype(np.float32) for _ in range(3)]
    arrays = floats + [target] + qkv
    want = forward(TF, *[torch.from_numpy(a.copy()) for a in arrays])
    got = forward(EF, *[vm.tensor(a, device=device) for a in arrays])
    for w, g in zip(want, got):
        w, g = w.numpy(), g.to("cpu:0").numpy()
        assert w.shape == g.shape and w.dtype == g.dtype
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
