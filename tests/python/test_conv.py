"""Products, convolution, pooling and attention against NumPy references: `matmul` of every
rank pair with batch broadcasting, `mm`, `bmm`, `addmm`, `baddbmm`, `dot`, `outer`,
`linear`; `conv2d` against an explicit loop; the pools against naive loops; attention
against NumPy's softmax. Random shapes, transposed (non-contiguous) operands, empty batches,
every dtype each op takes, on the host and the mock device.

Tolerances, relative to the magnitude of the result (`max(1, |reference|)`, the reference
computed in float64 from the values the array holds): float64 1e-10, float32 1e-4, float16
4e-3 (each result rounded once to float16, whose step is 2^-10 relative, after float32
accumulation), bfloat16 3e-2 (step 2^-7); integers exactly (small values, no wrapping)."""

import numpy as np
import pytest

import eagervm
import eagervm.nn.functional as F
from helpers import make, read

FLOATS = ["float16", "bfloat16", "float32", "float64"]
NUMERIC = ["uint8", "int32", "int64"] + FLOATS
TOL = {"float16": 4e-3, "bfloat16": 3e-2, "float32": 1e-4, "float64": 1e-10}


def rand(rng, shape, name):
    """Random values for dtype `name`: small integers for integer dtypes, else floats in
    [-1, 1)."""
    if name in ("uint8", "int32", "int64"):
        return rng.integers(0, 4, shape).astype(np.int64)
    return rng.uniform(-1, 1, shape)


def array(vm, ref, name, device, transposed=False):
    """An eagervm array of dtype `name` holding `ref` (transposed: a non-contiguous view
    whose last two dimensions are swapped in memory) and the float64 (or int64) values it
    holds."""
    ref = np.asarray(ref)
    if transposed and ref.ndim >= 2:
        x = make(vm, np.ascontiguousarray(np.swapaxes(ref, -1, -2)), name, device).transpose(-1, -2)
        assert not x.is_contiguous() or min(ref.shape[-2:]) <= 1 or ref.size == 0
    else:
        x = make(vm, ref, name, device)
    return x, held(x)


def held(x):
    """The values of `x`, as float64 (int64 for integer dtypes)."""
    v = np.asarray(read(x))
    return v.astype(np.int64) if v.dtype.kind in "biu" else v.astype(np.float64)


def check(got, want, name):
    """`got` (an eagervm array of dtype `name`) against the reference `want`."""
    assert got.dtype is getattr(eagervm, name)
    g = held(got)
    want = np.asarray(want)
    assert g.shape == want.shape, (g.shape, want.shape)
    if name in TOL:
        scale = np.maximum(1.0, np.abs(want))
        np.testing.assert_array_less(np.abs(g - want) / scale, TOL[name] + 0 * scale)
    else:
        want = want.astype(np.int64)
        if name == "uint8":
            want = want % 256  # uint8 products wrap
        np.testing.assert_array_equal(g, want)


MATMUL_SHAPES = [
    ((5,), (5,)),
    ((3, 5), (5,)),
    ((5,), (5, 4)),
    ((3, 5), (5, 4)),
    ((2, 3, 5), (2, 5, 4)),
    ((2, 1, 3, 5), (6, 5, 4)),
    ((5,), (2, 5, 4)),
    ((2, 3, 5), (5,)),
    ((3, 5), (2, 5, 4)),
    ((0, 3, 5), (5, 4)),
    ((2, 3, 0), (0, 4)),
    ((1, 2, 70, 80), (3, 1, 80, 90)),
]


@pytest.mark.parametrize("name", NUMERIC)
@pytest.mark.parametrize("a_shape,b_shape", MATMUL_SHAPES)
def test_matmul_of_every_rank_pair(vm, device, name, a_shape, b_shape):
    rng = np.random.default_rng(hash((a_shape, b_shape)) % 2**32)
    for transposed in (False, True):
        a, av = array(vm, rand(rng, a_shape, name), name, device, transposed)
        b, bv = array(vm, rand(rng, b_shape, name), name, device, transposed)
        want = np.matmul(av, bv)
        check(a @ b, want, name)
        check(eagervm.matmul(a, b), want, name)
        check(a.matmul(b), want, name)


def test_matmul_refusals(vm):
    a = vm.tensor([[1.0, 2.0]])
    with pytest.raises(eagervm.InvalidOperandsError):
        a @ vm.tensor([[1.0, 2.0]])
    with pytest.raises(eagervm.InvalidOperandsError):
        vm.tensor(1.0) @ a
    with pytest.raises(eagervm.InvalidOperandsError):
        vm.zeros(2, 3, 4) @ vm.zeros(3, 4, 2)


@pytest.mark.parametrize("name", NUMERIC)
def test_mm_bmm_dot_outer(vm, device, name):
    rng = np.random.default_rng(1)
    a, av = array(vm, rand(rng, (3, 4), name), name, device, True)
    b, bv = array(vm, rand(rng, (4, 2), name), name, device)
    check(a.mm(b), av @ bv, name)
    check(eagervm.mm(a, b), av @ bv, name)
    x, xv = array(vm, rand(rng, (2, 3, 4), name), name, device, True)
    y, yv = array(vm, rand(rng, (2, 4, 5), name), name, device)
    check(x.bmm(y), xv @ yv, name)
    check(eagervm.bmm(x, y), xv @ yv, name)
    u, uv = array(vm, rand(rng, (4,), name), name, device)
    w, wv = array(vm, rand(rng, (4,), name), name, device)
    check(u.dot(w), np.dot(uv, wv), name)
    check(eagervm.dot(u, w), np.dot(uv, wv), name)
    check(u.outer(x[0, 0]), np.outer(uv, xv[0, 0]), name)
    check(eagervm.outer(u, w), np.outer(uv, wv), name)
    with pytest.raises(eagervm.InvalidOperandsError):
        x.mm(y)
    with pytest.raises(eagervm.InvalidOperandsError):
        x.bmm(vm.zeros(3, 4, 5, dtype=x.dtype))
    with pytest.raises(eagervm.InvalidOperandsError):
        u.dot(x[0, 0, :3])


@pytest.mark.parametrize("name", FLOATS + ["int64"])
def test_addmm_and_baddbmm(vm, device, name):
    rng = np.random.default_rng(2)
    i, iv = array(vm, rand(rng, (4,), name), name, device)
    a, av = array(vm, rand(rng, (3, 5), name), name, device, True)
    b, bv = array(vm, rand(rng, (5, 4), name), name, device)
    (beta, alpha) = (2, 3) if name == "int64" else (0.5, -1.5)
    check(i.addmm(a, b), iv + av @ bv, name)
    check(eagervm.addmm(i, a, b, beta=beta, alpha=alpha), beta * iv + alpha * (av @ bv), name)
    x, xv = array(vm, rand(rng, (2, 3, 5), name), name, device)
    y, yv = array(vm, rand(rng, (2, 5, 4), name), name, device, True)
    j, jv = array(vm, rand(rng, (3, 1), name), name, device)
    check(eagervm.baddbmm(j, x, y, beta=beta, alpha=alpha), beta * jv + alpha * (xv @ yv), name)
    # beta 0: the input is not read, so its NaNs do not propagate.
    if name != "int64":
        nan = vm.full((3, 4), float("nan"), dtype=getattr(eagervm, name), device=device)
        check(eagervm.addmm(nan, a, b, beta=0), av @ bv, name)
    else:
        with pytest.raises(eagervm.InvalidOperandsError):
            eagervm.addmm(i, a, b, beta=0.5)
    with pytest.raises(eagervm.InvalidOperandsError):
        eagervm.addmm(vm.zeros(2, 3, 4, dtype=a.dtype, device=device), a, b)


@pytest.mark.parametrize("name", FLOATS)
def test_linear(vm, device, name):
    rng = np.random.default_rng(3)
    w, wv = array(vm, rand(rng, (6, 5), name), name, device)
    bias, bv = array(vm, rand(rng, (6,), name), name, device)
    for shape in [(5,), (3, 5), (2, 3, 5), (0, 5), (2, 0, 5)]:
        for transposed in (False, True):
            x, xv = array(vm, rand(rng, shape, name), name, device, transposed)
            check(F.linear(x, w), xv @ wv.T, name)
            check(F.linear(x, w, bias), xv @ wv.T + bv, name)
    x, xv = array(vm, rand(rng, (3, 5), name), name, device)
    w1, w1v = array(vm, rand(rng, (5,), name), name, device)
    check(F.linear(x, w1), xv @ w1v, name)


# ---- conv2d -----------------------------------------------------------------------------


def conv_ref(x, w, b, stride, pad, dilation, groups):
    """The convolution as PyTorch defines it, by an explicit loop; `pad` is (top, bottom,
    left, right)."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (dh, dw) = stride, dilation
    top, bottom, left, right = pad
    oh = (h + top + bottom - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + left + right - dw * (kw - 1) - 1) // sw + 1
    og = o // groups
    out = np.zeros((n, o, oh, ow))
    for ni in range(n):
        for oo in range(o):
            g = oo // og
            for y in range(oh):
                for xx in range(ow):
                    s = 0.0 if b is None else b[oo]
                    for ci in range(cg):
                        for i in range(kh):
                            for j in range(kw):
                                hy, wx = y * sh - top + i * dh, xx * sw - left + j * dw
                                if 0 <= hy < h and 0 <= wx < wd:
                                    s += x[ni, g * cg + ci, hy, wx] * w[oo, ci, i, j]
                    out[ni, oo, y, xx] = s
    return out


def pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


CONV_CASES = [
    # x shape, w shape, stride, padding, dilation, groups, bias
    ((2, 3, 6, 7), (4, 3, 3, 3), 1, 0, 1, 1, True),
    ((1, 2, 7, 5), (3, 2, 2, 3), (2, 1), (1, 2), 1, 1, False),
    ((2, 4, 8, 8), (6, 2, 3, 3), 2, 1, (2, 1), 2, True),
    ((1, 4, 5, 5), (4, 1, 3, 3), 1, "same", 1, 4, True),
    ((1, 2, 6, 6), (2, 2, 4, 2), 1, "same", (1, 2), 1, True),
    ((2, 2, 5, 6), (3, 2, 3, 2), 1, "valid", 1, 1, False),
    ((3, 2, 4), (5, 3, 2, 2), 1, 1, 1, 1, True),  # unbatched [C, H, W]
    ((0, 2, 4, 4), (3, 2, 3, 3), 1, 0, 1, 1, True),
    ((1, 8, 16, 16), (16, 8, 3, 3), 1, 1, 1, 1, True),
]


def pads(padding, w_shape, dilation):
    if padding == "valid":
        return (0, 0, 0, 0)
    if padding == "same":
        dh, dw = pair(dilation)
        th, tw = dh * (w_shape[2] - 1), dw * (w_shape[3] - 1)
        return (th // 2, th - th // 2, tw // 2, tw - tw // 2)
    ph, pw = pair(padding)
    return (ph, ph, pw, pw)


@pytest.mark.parametrize("name", FLOATS)
@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_conv2d_against_the_loop(vm, device, name, case):
    xs, ws, stride, padding, dilation, groups, with_bias = CONV_CASES[case]
    if len(xs) == 3:
        xs = (ws[1] * groups,) + xs[1:]
    rng = np.random.default_rng(case)
    for transposed in (False, True):
        x, xv = array(vm, rand(rng, xs, name), name, device, transposed)
        w, wv = array(vm, rand(rng, ws, name), name, device)
        b, bv = array(vm, rand(rng, (ws[0],), name), name, device) if with_bias else (None, None)
        got = F.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)
        x4 = xv[None] if xv.ndim == 3 else xv
        want = conv_ref(x4, wv, bv, pair(stride), pads(padding, ws, dilation), pair(dilation), groups)
        check(got, want[0] if xv.ndim == 3 else want, name)
    assert eagervm.conv2d is F.conv2d


def test_conv2d_refusals(vm):
    x = vm.zeros(1, 4, 5, 5)
    with pytest.raises(eagervm.InvalidOperandsError):
        F.conv2d(x, vm.zeros(2, 3, 3, 3))
    with pytest.raises(eagervm.InvalidOperandsError):
        F.conv2d(x, vm.zeros(2, 4, 7, 3))
    with pytest.raises(eagervm.InvalidOperandsError):
        F.conv2d(x, vm.zeros(2, 4, 3, 3), stride=2, padding="same")
    with pytest.raises(eagervm.InvalidOperandsError):
        F.conv2d(x.long(), vm.zeros(2, 4, 3, 3).long())
    with pytest.raises(eagervm.InvalidOperandsError):
        F.conv2d(x, vm.zeros(2, 4, 3, 3), vm.zeros(3))
    with pytest.raises(ValueError):
        F.conv2d(x, vm.zeros(2, 4, 3, 3), padding="full")


# ---- pooling ----------------------------------------------------------------------------


def out_size(size, k, s, p, d, ceil):
    span = d * (k - 1) + 1
    num = size + 2 * p - span
    out = (-(-num // s) if ceil else num // s) + 1
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    return out


def max_pool_ref(x, k, s, p, d, ceil):
    n, c, h, w = x.shape
    oh, ow = out_size(h, k[0], s[0], p[0], d[0], ceil), out_size(w, k[1], s[1], p[1], d[1], ceil)
    vals = np.zeros((n, c, oh, ow), x.dtype)
    idx = np.zeros((n, c, oh, ow), np.int64)
    for ni in range(n):
        for ci in range(c):
            for y in range(oh):
                for xx in range(ow):
                    best = None
                    for i in range(k[0]):
                        for j in range(k[1]):
                            hy, wx = y * s[0] - p[0] + i * d[0], xx * s[1] - p[1] + j * d[1]
                            if 0 <= hy < h and 0 <= wx < w:
                                v = x[ni, ci, hy, wx]
                                if best is None or v > best[0] or np.isnan(v):
                                    best = (v, hy * w + wx)
                    vals[ni, ci, y, xx], idx[ni, ci, y, xx] = best
    return vals, idx


POOL_CASES = [
    # x shape, kernel, stride, padding, dilation, ceil_mode
    ((2, 3, 6, 6), 2, None, 0, 1, False),
    ((1, 2, 7, 5), (3, 2), (2, 1), (1, 1), 1, False),
    ((1, 2, 7, 7), 3, 2, 1, 1, True),
    ((2, 1, 9, 8), 3, 2, 1, (2, 1), True),
    ((3, 5, 5), 2, 1, 1, 1, False),  # unbatched
    ((0, 2, 4, 4), 2, 2, 0, 1, False),
]


@pytest.mark.parametrize("name", NUMERIC)
@pytest.mark.parametrize("case", range(len(POOL_CASES)))
def test_max_pool2d_against_the_loop(vm, device, name, case):
    xs, k, s, p, d, ceil = POOL_CASES[case]
    rng = np.random.default_rng(10 + case)
    x, xv = array(vm, rand(rng, xs, name) * 7, name, device, transposed=case % 2 == 1)
    v, i = F.max_pool2d(x, k, s, p, d, ceil, return_indices=True)
    only = F.max_pool2d(x, k, stride=s, padding=p, dilation=d, ceil_mode=ceil)
    x4 = xv[None] if xv.ndim == 3 else xv
    wv, wi = max_pool_ref(x4, pair(k), pair(s if s is not None else k), pair(p), pair(d), ceil)
    if xv.ndim == 3:
        wv, wi = wv[0], wi[0]
    check(v, wv, name)
    check(only, wv, name)
    assert i.dtype is eagervm.int64
    np.testing.assert_array_equal(i.numpy(), wi)


def test_max_pool2d_propagates_nan(vm):
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    x[0, 0, 1, 0] = np.nan
    v, i = F.max_pool2d(vm.tensor(x), 2, return_indices=True)
    assert np.isnan(v.numpy()[0, 0, 0, 0]) and i.numpy()[0, 0, 0, 0] == 4
    assert v.numpy()[0, 0, 1, 1] == 15
    with pytest.raises(eagervm.InvalidOperandsError):
        F.max_pool2d(vm.tensor(x), 2, padding=2)


def avg_pool_ref(x, k, s, p, ceil, include_pad, divisor):
    n, c, h, w = x.shape
    oh, ow = out_size(h, k[0], s[0], p[0], 1, ceil), out_size(w, k[1], s[1], p[1], 1, ceil)
    out = np.zeros((n, c, oh, ow))
    for y in range(oh):
        for xx in range(ow):
            h0, w0 = y * s[0] - p[0], xx * s[1] - p[1]
            h1, w1 = min(h0 + k[0], h + p[0]), min(w0 + k[1], w + p[1])
            pool = (h1 - h0) * (w1 - w0)
            h0, w0, h1, w1 = max(h0, 0), max(w0, 0), min(h1, h), min(w1, w)
            if h0 >= h1 or w0 >= w1:
                continue
            total = x[:, :, h0:h1, w0:w1].sum(axis=(2, 3))
            dv = divisor if divisor else pool if include_pad else (h1 - h0) * (w1 - w0)
            out[:, :, y, xx] = total / dv
    return out


@pytest.mark.parametrize("name", FLOATS)
@pytest.mark.parametrize("case", range(len(POOL_CASES)))
@pytest.mark.parametrize("include_pad,divisor", [(True, None), (False, None), (True, 3)])
def test_avg_pool2d_against_the_loop(vm, device, name, case, include_pad, divisor):
    xs, k, s, p, d, ceil = POOL_CASES[case]
    rng = np.random.default_rng(20 + case)
    x, xv = array(vm, rand(rng, xs, name), name, device, transposed=case % 2 == 0)
    got = F.avg_pool2d(x, k, s, p, ceil, count_include_pad=include_pad, divisor_override=divisor)
    x4 = xv[None] if xv.ndim == 3 else xv
    want = avg_pool_ref(x4, pair(k), pair(s if s is not None else k), pair(p), ceil, include_pad, divisor)
    check(got, want[0] if xv.ndim == 3 else want, name)


@pytest.mark.parametrize("name", FLOATS)
@pytest.mark.parametrize(
    "xs,size", [((2, 3, 7, 5), (3, 2)), ((1, 2, 4, 4), 1), ((1, 1, 5, 6), (5, 6)), ((3, 8, 9), (None, 4)), ((0, 2, 3, 3), 2)]
)
def test_adaptive_avg_pool2d(vm, device, name, xs, size):
    rng = np.random.default_rng(30)
    x, xv = array(vm, rand(rng, xs, name), name, device, transposed=True)
    got = F.adaptive_avg_pool2d(x, size)
    h, w = xs[-2:]
    oh, ow = (size, size) if isinstance(size, int) else (size[0] or h, size[1] or w)
    x4 = xv[None] if xv.ndim == 3 else xv
    want = np.zeros(x4.shape[:2] + (oh, ow))
    for i in range(oh):
        for j in range(ow):
            h0, h1 = (i * h) // oh, -(-((i + 1) * h) // oh)
            w0, w1 = (j * w) // ow, -(-((j + 1) * w) // ow)
            want[:, :, i, j] = x4[:, :, h0:h1, w0:w1].mean(axis=(2, 3))
    check(got, want[0] if xv.ndim == 3 else want, name)


# ---- attention --------------------------------------------------------------------------


def sdpa_ref(q, k, v, mask=None, causal=False, scale=None):
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    if causal:
        ll, ss = s.shape[-2:]
        s = np.where(np.tril(np.ones((ll, ss), bool)), s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
    return np.matmul(p, v)


@pytest.mark.parametrize("name", FLOATS)
def test_scaled_dot_product_attention(vm, device, name):
    rng = np.random.default_rng(40)
    shapes = [
        ((2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 6)),
        ((2, 1, 4, 8), (3, 5, 8), (3, 5, 8)),  # batch dimensions broadcast
        ((4, 8), (4, 8), (4, 2)),
        ((0, 3, 4, 8), (0, 3, 4, 8), (0, 3, 4, 8)),
    ]
    for qs, ks, vs in shapes:
        q, qv = array(vm, rand(rng, qs, name), name, device, True)
        k, kv = array(vm, rand(rng, ks, name), name, device)
        v, vv = array(vm, rand(rng, vs, name), name, device, True)
        check(F.scaled_dot_product_attention(q, k, v), sdpa_ref(qv, kv, vv), name)
        check(F.scaled_dot_product_attention(q, k, v, scale=0.3), sdpa_ref(qv, kv, vv, scale=0.3), name)
        if qs[-2] <= ks[-2]:
            check(F.scaled_dot_product_attention(q, k, v, is_causal=True), sdpa_ref(qv, kv, vv, causal=True), name)
        ls = (qs[-2], ks[-2])
        bmask = rng.integers(0, 2, ls).astype(bool)
        bmask[:, 0] = True
        m = vm.array(bmask, device)
        check(F.scaled_dot_product_attention(q, k, v, attn_mask=m), sdpa_ref(qv, kv, vv, bmask), name)
        fm, fmv = array(vm, rand(rng, ls, name), name, device)
        check(F.scaled_dot_product_attention(q, k, v, fm), sdpa_ref(qv, kv, vv, fmv), name)


def test_attention_refusals(vm):
    q = vm.zeros(2, 4, 8)
    with pytest.raises(eagervm.InvalidOperandsError, match="random generator"):
        F.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    with pytest.raises(eagervm.InvalidOperandsError):
        F.scaled_dot_product_attention(q, q, q, attn_mask=vm.ones(4, 4, dtype=eagervm.bool), is_causal=True)
    with pytest.raises(eagervm.InvalidOperandsError):
        F.scaled_dot_product_attention(q, vm.zeros(2, 4, 7), q)
    with pytest.raises(eagervm.InvalidOperandsError):
        F.scaled_dot_product_attention(q.long(), q.long(), q.long())
    # A fully masked row gives NaN, as PyTorch's math reference.
    out = F.scaled_dot_product_attention(q, q, q, attn_mask=vm.zeros(4, 4, dtype=eagervm.bool))
    assert np.isnan(out.numpy()).all()


def test_against_pytorch_where_installed(vm):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(50)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 2)).astype(np.float32)
    got = F.conv2d(vm.tensor(x), vm.tensor(w), padding="same", dilation=2).numpy()
    want = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), padding="same", dilation=2).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)
    v, i = F.max_pool2d(vm.tensor(x), 3, 2, 1, ceil_mode=True, return_indices=True)
    tv, ti = torch.nn.functional.max_pool2d(torch.tensor(x), 3, 2, 1, ceil_mode=True, return_indices=True)
    np.testing.assert_array_equal(v.numpy(), tv.numpy())
    np.testing.assert_array_equal(i.numpy(), ti.numpy())


def test_calls_record_and_replay_with_their_parameters(vm, tmp_path):
    path = tmp_path / "conv.trace"
    rec = vm.record(path)
    rng = np.random.default_rng(60)
    x = vm.array(rng.standard_normal((2, 3, 8, 8)).astype(np.float32), "mock:0")
    w = vm.array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "mock:0")
    y = F.conv2d(x, w, stride=(2, 1), padding=(1, 2), dilation=(1, 2))
    v, i = F.max_pool2d(y, 2, return_indices=True, ceil_mode=True)
    a = F.avg_pool2d(y, 3, 1, 1, count_include_pad=False)
    g = F.adaptive_avg_pool2d(y, (3, 2))
    q = y.reshape(2, 4, -1)
    att = F.scaled_dot_product_attention(q, q, q, is_causal=True, scale=0.25)
    b = q @ q.transpose(-1, -2)
    outs = [t.to("cpu:0") for t in (v, i, a, g, att, b)]
    summary = rec.finish(outs)
    assert summary["expects"] == len(outs) and summary["failure"] is None
    r = eagervm.replay(path)
    assert r["checked"] == len(outs) and r["failures"] == []


@pytest.mark.parametrize("seed", range(6))
def test_random_shapes(vm, device, seed):
    """Random ranks, sizes (0 among them), broadcast batch dimensions, layouts and
    convolution parameters, in float64 (the order of the sums is the only difference)."""
    rng = np.random.default_rng(100 + seed)
    for _ in range(8):
        m, k, n = rng.integers(0, 6, 3)
        batch = list(rng.integers(1, 4, rng.integers(0, 3)))
        ba = [d if rng.random() < 0.6 else 1 for d in batch][rng.integers(0, len(batch) + 1) :]
        bb = [d if rng.random() < 0.6 else 1 for d in batch][rng.integers(0, len(batch) + 1) :]
        # A vector operand has no batch dimensions.
        a_shape = tuple(ba) + (m, k) if rng.random() < 0.8 else (k,)
        b_shape = tuple(bb) + (k, n) if rng.random() < 0.8 else (k,)
        a, av = array(vm, rng.uniform(-1, 1, a_shape), "float64", device, rng.random() < 0.5)
        b, bv = array(vm, rng.uniform(-1, 1, b_shape), "float64", device, rng.random() < 0.5)
        check(a @ b, np.matmul(av, bv), "float64")
    for _ in range(4):
        groups = int(rng.integers(1, 3))
        cg, og = rng.integers(1, 3, 2)
        kh, kw = rng.integers(1, 4, 2)
        stride, dilation = tuple(rng.integers(1, 3, 2)), tuple(rng.integers(1, 3, 2))
        padding = tuple(rng.integers(0, 3, 2))
        h = int(dilation[0] * (kh - 1) + 1 + rng.integers(0, 5))
        w = int(dilation[1] * (kw - 1) + 1 + rng.integers(0, 5))
        xs, ws = (int(rng.integers(0, 3)), int(cg * groups), h, w), (int(og * groups), int(cg), int(kh), int(kw))
        x, xv = array(vm, rng.uniform(-1, 1, xs), "float64", device, rng.random() < 0.5)
        wt, wv = array(vm, rng.uniform(-1, 1, ws), "float64", device, rng.random() < 0.5)
        got = F.conv2d(x, wt, None, stride, padding, dilation, groups)
        pad = (padding[0], padding[0], padding[1], padding[1])
        check(got, conv_ref(xv, wv, None, stride, pad, dilation, groups), "float64")
