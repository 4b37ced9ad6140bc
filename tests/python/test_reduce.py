"""Reductions along dims, scans, softmax, layer_norm and the losses against NumPy: random
shapes, every dim set (negative dims too), keepdim, transposed and expanded views, 0-d and
empty arrays, NaN and infinities, the dtypes each op takes, and PyTorch's refusals.

Tolerances: float64 results agree with NumPy's float64 to a relative 1e-12 (the orders of
summation differ); float32 to 1e-5; float16 and bfloat16 (accumulated in float32, rounded
once) to one unit of their last place, 1e-3 and 1e-2. Integer results are exact."""

import itertools
import math

import numpy as np
import pytest

import eagervm
import eagervm.nn.functional as F
from helpers import DTYPES, make, read

TOL = {"float64": 1e-12, "float32": 1e-5, "float16": 1e-3, "bfloat16": 1e-2}


def close(got, want, name, **kw):
    got = np.asarray(read(got) if isinstance(got, eagervm.Array) else got, dtype=np.float64)
    np.testing.assert_allclose(got, np.asarray(want, dtype=np.float64), rtol=TOL[name], atol=TOL[name], **kw)


def dim_sets(rank):
    """Every set of dims of a tensor of `rank` dims, as tuples, each also with negative dims."""
    for k in range(rank + 1):
        for c in itertools.combinations(range(rank), k):
            yield c
            if c:
                yield tuple(d - rank for d in c)


def shapes(rng, n=6):
    for _ in range(n):
        rank = int(rng.integers(0, 4))
        yield tuple(int(rng.integers(1, 4)) for _ in range(rank))


NP = {
    "sum": lambda a, ax, kd: np.sum(a, axis=ax, keepdims=kd),
    "mean": lambda a, ax, kd: np.mean(a, axis=ax, keepdims=kd),
    "amax": lambda a, ax, kd: np.amax(a, axis=ax, keepdims=kd),
    "amin": lambda a, ax, kd: np.amin(a, axis=ax, keepdims=kd),
    "var": lambda a, ax, kd: np.var(a, axis=ax, keepdims=kd, ddof=1),
    "std": lambda a, ax, kd: np.std(a, axis=ax, keepdims=kd, ddof=1),
    "logsumexp": lambda a, ax, kd: np.log(np.sum(np.exp(a), axis=ax, keepdims=kd)),
    "norm": lambda a, ax, kd: np.sqrt(np.sum(a * a, axis=ax, keepdims=kd)),
}


def call(x, op, dims, keepdim):
    if op in ("amax", "amin"):
        return getattr(x, op)(dims, keepdim)
    if op == "logsumexp":
        return x.logsumexp(dims, keepdim)
    if op == "norm":
        return x.norm(2, dims if dims else None, keepdim)
    return getattr(x, op)(dim=dims, keepdim=keepdim)


@pytest.mark.parametrize("name", ["float32", "float64"])
def test_reductions_over_every_dim_set(vm, device, name):
    rng = np.random.default_rng(1)
    for shape in shapes(rng):
        ref = rng.standard_normal(shape).astype(name)
        x = make(vm, ref, name, device)
        for dims in dim_sets(len(shape)):
            ax = tuple(d % max(len(shape), 1) for d in dims) if shape else None
            ax = ax if ax else None
            for keepdim in (False, True):
                for op, f in NP.items():
                    got = call(x, op, dims, keepdim)
                    with np.errstate(all="ignore"):
                        want = f(ref.astype(np.float64), ax, keepdim)
                    assert got.shape == np.shape(want), (op, shape, dims, keepdim)
                    assert got.dtype == x.dtype
                    close(got, want, name, err_msg=f"{op} {shape} {dims} {keepdim}")


def test_views_reduce_as_their_values(vm, device):
    rng = np.random.default_rng(2)
    ref = rng.standard_normal((4, 5, 3)).astype(np.float64)
    x = vm.array(ref, device)
    views = [
        (x.permute(2, 0, 1), ref.transpose(2, 0, 1)),
        (x.transpose(0, 2), ref.transpose(2, 1, 0)),
        (x[:, ::2, 1:], ref[:, ::2, 1:]),
        (x[:, :1, :].expand(4, 6, 3), np.broadcast_to(ref[:, :1, :], (4, 6, 3))),
        (x[1:3], ref[1:3]),
    ]
    for v, r in views:
        for dims in dim_sets(3):
            ax = tuple(d % 3 for d in dims) or None
            close(v.sum(dim=dims, keepdim=True), r.sum(axis=ax, keepdims=True), "float64")
            close(v.mean(dim=dims), r.mean(axis=ax), "float64")
            close(v.amax(dims), r.max(axis=ax), "float64")
            close(v.var(dims if dims else None), r.var(axis=ax, ddof=1), "float64")
        for d in range(3):
            vals, idx = v.max(d)
            assert_same_int(idx, r.argmax(axis=d))
            close(vals, r.max(axis=d), "float64")
            close(v.cumsum(d), np.cumsum(r, axis=d), "float64")
            close(v.softmax(d), np.exp(r) / np.exp(r).sum(axis=d, keepdims=True), "float64")


def assert_same_int(got, want):
    np.testing.assert_array_equal(read(got), np.asarray(want))


def test_the_whole_tensor_forms(vm, device):
    ref = np.array([[3.0, -1.0, 7.0], [7.0, 2.0, -5.0]], np.float32)
    x = vm.array(ref, device)
    assert x.sum().shape == () and x.sum().item() == ref.sum()
    assert x.max().item() == 7.0 and x.min().item() == -5.0
    assert x.argmax().item() == 2 and x.argmin().item() == 5
    assert x.argmax(keepdim=True).shape == (1, 1)
    assert x.sum(keepdim=True).shape == (1, 1)
    assert x.sum(dim=()).item() == ref.sum()
    assert x.prod().item() == pytest.approx(ref.prod())
    assert x.mean().item() == pytest.approx(ref.mean())
    assert eagervm.sum(x, dim=1).tolist() == [9.0, 4.0]
    assert eagervm.mean(x, 0, True).shape == (1, 3)
    assert eagervm.max(x).item() == 7.0
    assert eagervm.argmax(x, dim=1).tolist() == [2, 0]
    assert eagervm.linalg.vector_norm(x, ord=1).item() == pytest.approx(np.abs(ref).sum())
    assert eagervm.linalg.vector_norm(x, ord=math.inf, dim=1).tolist() == [7.0, 7.0]
    assert eagervm.norm(x).item() == pytest.approx(np.sqrt((ref * ref).sum()), rel=1e-6)
    assert x.norm(p=0).item() == 6.0
    assert x.norm(p=3, dim=0).tolist() == pytest.approx(list(np.cbrt((np.abs(ref) ** 3).sum(0))), rel=1e-6)
    assert x.norm(p=-math.inf, dim=1).tolist() == [1.0, 2.0]


def test_max_and_min_with_a_dim_return_values_and_indices(vm, device):
    ref = np.array([[1, 5, 5], [4, 4, 0]], np.int32)
    x = vm.array(ref, device)
    r = x.max(dim=1)
    assert isinstance(r, eagervm.return_types.max) and isinstance(r, tuple)
    values, indices = r
    assert values.tolist() == [5, 4] and values.dtype == eagervm.int32
    assert indices.tolist() == [1, 0] and indices.dtype == eagervm.int64
    assert r.values.tolist() == [5, 4] and r.indices.tolist() == [1, 0]
    m = x.min(0, keepdim=True)
    assert m.values.tolist() == [[1, 4, 0]] and m.indices.tolist() == [[0, 1, 1]]
    assert eagervm.min(x, dim=-1).indices.tolist() == [0, 2]
    # NaN is the extreme, at its first place.
    f = vm.array(np.array([[1.0, np.nan, 3.0, np.nan]], np.float32), device)
    v, i = f.max(1)
    assert math.isnan(v.item()) and i.item() == 1
    assert math.isnan(f.amin().item()) and f.argmin().item() == 1
    with pytest.raises(TypeError):
        x.max(x)


@pytest.mark.parametrize("name", DTYPES)
def test_dtypes(vm, name):
    rng = np.random.default_rng(3)
    ref = (rng.integers(0, 4, (3, 4)) if name != "bool" else rng.integers(0, 2, (3, 4))).astype(np.float64)
    x = make(vm, ref.astype(bool) if name == "bool" else ref, name)
    integral = name in ("bool", "uint8", "int32", "int64")
    s = x.sum(dim=1)
    assert s.dtype == (eagervm.int64 if integral else x.dtype)
    assert_same_int(s.to(eagervm.float64), ref.sum(1))
    p = x.prod(1)
    assert p.dtype == (eagervm.int64 if integral else x.dtype)
    assert_same_int(p.to(eagervm.float64), ref.prod(1))
    assert x.amax(1).dtype == x.dtype
    assert_same_int(x.amax(1).to(eagervm.float64), ref.max(1))
    assert_same_int(x.max(0).indices, ref.argmax(0))
    assert x.all(1).dtype == (eagervm.uint8 if name == "uint8" else eagervm.bool)
    assert_same_int(x.all(1).to(eagervm.bool), ref.all(1))
    assert_same_int(x.any(0).to(eagervm.bool), ref.any(0))
    assert_same_int(x.cumsum(1).to(eagervm.float64), np.cumsum(ref, 1))
    if name != "bool":
        assert_same_int(x.argmin(1), ref.argmin(1))
    if integral:
        with pytest.raises(eagervm.InvalidOperandsError):
            x.mean()
        close(x.mean(dim=0, dtype=eagervm.float64), ref.mean(0), "float64")
        with pytest.raises(eagervm.InvalidOperandsError):
            x.softmax(0)
        close(x.softmax(0, dtype=eagervm.float32), np.exp(ref) / np.exp(ref).sum(0), "float32")
        close(x.logsumexp(1), np.log(np.exp(ref).sum(1)), "float32")
    else:
        close(x.mean(0), ref.mean(0), name)
        close(x.var(1), ref.var(1, ddof=1), name)
        close(x.std(0, correction=0), ref.std(0), name)
        close(x.softmax(1), np.exp(ref) / np.exp(ref).sum(1, keepdims=True), name)
        close(x.log_softmax(0), ref - np.log(np.exp(ref).sum(0)), name)
    assert x.sum(dtype=eagervm.float64).dtype == eagervm.float64


def test_half_precision_accumulates_in_float32(vm):
    x = vm.array(np.array([2048.0, 1.0, 1.0], np.float16))
    assert x.sum(dim=0).item() == 2050.0
    b = vm.array(np.array([[256.0, 1.0, 1.0]], np.float32)).to(eagervm.bfloat16)
    assert b.sum(1).float().item() == 258.0


def test_empty_and_0d(vm, device):
    e = vm.zeros(0, 3, device=device)
    assert e.sum().item() == 0.0
    assert e.sum(0).tolist() == [0.0, 0.0, 0.0]
    assert e.prod(0).tolist() == [1.0, 1.0, 1.0]
    assert all(math.isnan(v) for v in e.mean(0).tolist())
    assert math.isnan(e.mean().item())
    assert e.amax(1).shape == (0,)
    assert e.all().item() is True and e.any().item() is False
    for f in (lambda: e.max(), lambda: e.amax(0), lambda: e.max(0), lambda: e.argmax(), lambda: e.min(dim=0)):
        with pytest.raises(eagervm.InvalidOperandsError):
            f()
    s = vm.array(np.array(2.5), device)
    assert s.sum(0).item() == 2.5 and s.sum(-1, keepdim=True).shape == ()
    v, i = s.max(0)
    assert v.item() == 2.5 and i.item() == 0
    assert s.softmax(0).item() == 1.0
    assert s.cumsum(0).item() == 2.5
    with pytest.raises(IndexError):
        s.sum(1)


def test_bad_dims(vm):
    x = vm.zeros(2, 3)
    with pytest.raises(eagervm.InvalidOperandsError):
        x.sum(dim=(1, -1))
    with pytest.raises(eagervm.InvalidOperandsError):
        x.amax((0, 0))
    with pytest.raises(IndexError):
        x.sum(2)
    with pytest.raises(IndexError):
        x.max(-3)
    with pytest.raises(IndexError):
        x.softmax(5)
    with pytest.raises(TypeError):
        x.sum(dim=1.5)


def test_nan_and_inf(vm, device):
    ref = np.array([[1.0, np.inf, -np.inf], [np.nan, 0.0, 1.0], [-np.inf, -np.inf, -np.inf]])
    x = vm.array(ref, device)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(read(x.sum(1)), ref.sum(1))
        np.testing.assert_array_equal(read(x.amax(1)), ref.max(1))
    lse = read(x.logsumexp(1))
    assert lse[0] == np.inf and math.isnan(lse[1]) and lse[2] == -np.inf
    sm = read(x.softmax(1))
    assert np.isnan(sm[1]).all() and np.isnan(sm[2]).all()


def test_cumsum_and_cumprod(vm, device):
    rng = np.random.default_rng(4)
    ref = rng.standard_normal((3, 4, 2))
    x = vm.array(ref, device)
    for d in range(-3, 3):
        close(x.cumsum(d), np.cumsum(ref, d), "float64")
        close(eagervm.cumprod(x, d), np.cumprod(ref, d), "float64")
    i = vm.array(np.array([1, 2, 3], np.int32), device)
    c = i.cumsum(0)
    assert c.dtype == eagervm.int64 and c.tolist() == [1, 3, 6]
    assert i.cumsum(0, dtype=eagervm.float32).dtype == eagervm.float32


def np_log_softmax(a, axis):
    m = a.max(axis=axis, keepdims=True)
    return a - m - np.log(np.exp(a - m).sum(axis=axis, keepdims=True))


def test_softmax_functional(vm, device):
    rng = np.random.default_rng(5)
    ref = rng.standard_normal((2, 3, 4)) * 50
    x = vm.array(ref, device)
    for d in range(-3, 3):
        close(F.softmax(x, dim=d), np.exp(np_log_softmax(ref, d)), "float64")
        close(F.log_softmax(x, d), np_log_softmax(ref, d), "float64")
        close(eagervm.softmax(x, d), np.exp(np_log_softmax(ref, d)), "float64")
    assert F.softmax(x.float(), -1, dtype=eagervm.float64).dtype == eagervm.float64


def test_layer_norm(vm, device):
    rng = np.random.default_rng(6)
    ref = rng.standard_normal((2, 3, 4))
    w, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    x = vm.array(ref, device)
    for ns, weight, bias in [((4,), None, None), ((3, 4), w, b), ((4,), w[0], None), (4, None, b[0])]:
        k = 1 if isinstance(ns, int) else len(ns)
        axes = tuple(range(3 - k, 3))
        m = ref.mean(axis=axes, keepdims=True)
        v = ref.var(axis=axes, keepdims=True)
        want = (ref - m) / np.sqrt(v + 1e-5)
        if weight is not None:
            want = want * weight
        if bias is not None:
            want = want + bias
        got = F.layer_norm(
            x,
            ns,
            None if weight is None else vm.array(weight, device),
            None if bias is None else vm.array(bias, device),
        )
        close(got, want, "float64")
    with pytest.raises(eagervm.InvalidOperandsError):
        F.layer_norm(x, (3,))


def np_nll(logp, target, weight=None, ignore_index=-100, reduction="mean"):
    """PyTorch's nll_loss over [N, C, ...] log-probabilities."""
    c = logp.shape[1]
    w = np.ones(c) if weight is None else weight
    lp = np.moveaxis(logp, 1, -1).reshape(-1, c)
    t = target.reshape(-1)
    keep = t != ignore_index
    safe = np.where(keep, t, 0)
    losses = np.where(keep, -lp[np.arange(len(t)), safe] * w[safe], 0.0)
    ws = np.where(keep, w[safe], 0.0)
    if reduction == "none":
        return losses.reshape(target.shape)
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / ws.sum()


def np_cross_entropy(x, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """PyTorch's cross_entropy (class indices or probabilities), after its source."""
    cdim = 1 if x.ndim > 1 else 0
    logp = np_log_softmax(x, cdim)
    c = x.shape[cdim]
    wshape = [1] * x.ndim
    wshape[cdim] = c
    wb = None if weight is None else weight.reshape(wshape)
    if target.dtype.kind == "f":
        t = target * (1 - label_smoothing) + label_smoothing / c
        per = -(logp * t * (1 if wb is None else wb)).sum(axis=cdim)
        return {"none": per, "sum": per.sum(), "mean": per.sum() / (x.size / c)}[reduction]
    if x.ndim == 1:
        out = np_cross_entropy(x[None], target[None], weight, ignore_index, reduction, label_smoothing)
        return np.reshape(out, ())
    nll = np_nll(logp, target, weight, ignore_index, reduction)
    if label_smoothing == 0:
        return nll
    smooth = -(logp * (1 if wb is None else wb)).sum(axis=1)
    ignored = target == ignore_index
    smooth = np.where(ignored, 0.0, smooth)
    if reduction == "none":
        s = smooth
    elif reduction == "sum":
        s = smooth.sum()
    else:
        w = np.ones(c) if weight is None else weight
        s = smooth.sum() / w[np.where(ignored, 0, target)][~ignored].sum()
    return (1 - label_smoothing) * nll + s * (label_smoothing / c)


def test_losses(vm, device):
    rng = np.random.default_rng(7)
    for shape in [(5, 4), (3, 4, 2), (2, 3, 2, 2)]:
        x = rng.standard_normal(shape)
        c = shape[1]
        tshape = (shape[0],) + shape[2:]
        target = rng.integers(0, c, tshape)
        target.reshape(-1)[1] = -100
        weight = rng.random(c) + 0.5
        probs = np.exp(np_log_softmax(rng.standard_normal(shape), 1))
        xa, ta, wa, pa = (vm.array(a, device) for a in (x, target, weight, probs))
        for reduction in ("none", "mean", "sum"):
            for w, wn in ((None, None), (wa, weight)):
                logp = np_log_softmax(x, 1)
                close(
                    F.nll_loss(vm.array(logp, device), ta, weight=w, reduction=reduction),
                    np_nll(logp, target, wn, reduction=reduction),
                    "float64",
                )
                for ls in (0.0, 0.2):
                    close(
                        F.cross_entropy(xa, ta, weight=w, reduction=reduction, label_smoothing=ls),
                        np_cross_entropy(x, target, wn, reduction=reduction, label_smoothing=ls),
                        "float64",
                        err_msg=f"{shape} {reduction} {wn is not None} {ls}",
                    )
                    close(
                        F.cross_entropy(xa, pa, weight=w, reduction=reduction, label_smoothing=ls),
                        np_cross_entropy(x, probs, wn, reduction=reduction, label_smoothing=ls),
                        "float64",
                    )
            y = rng.standard_normal(shape)
            d = (x - y) ** 2
            close(F.mse_loss(xa, vm.array(y, device), reduction=reduction), {"none": d, "sum": d.sum(), "mean": d.mean()}[reduction], "float64")
    # Unbatched [C] input with a 0-d target; ignore_index; bad targets and reductions.
    x = rng.standard_normal(5)
    xa = vm.array(x, device)
    close(F.cross_entropy(xa, vm.array(np.array(3), device)), -np_log_softmax(x, 0)[3], "float64")
    close(F.nll_loss(xa, vm.array(np.array(2), device), reduction="none"), -x[2], "float64")
    t = vm.array(np.array([0, 7]), device)
    with pytest.raises(eagervm.Error):
        F.nll_loss(vm.array(np.zeros((2, 3)), device), t).item()
    with pytest.raises(ValueError):
        F.cross_entropy(vm.array(np.zeros((2, 3)), device), vm.array(np.array([0, 1]), device), reduction="avg")
    f32 = F.cross_entropy(vm.array(np.zeros((2, 3), np.float32), device), vm.array(np.array([0, 1]), device))
    assert f32.dtype == eagervm.float32 and f32.item() == pytest.approx(math.log(3))


def test_traces_record_and_replay_the_parameter_lists(vm, tmp_path):
    path = tmp_path / "r.trace"
    rec = vm.record(path)
    x = vm.array(np.arange(12, dtype=np.float32).reshape(3, 4) - 5, "mock:0")
    t = vm.array(np.array([0, 3, 1]), "mock:0")
    v, i = x.max(dim=0)
    outs = [
        x.sum(dim=1, keepdim=True).to("cpu:0"),
        v.to("cpu:0"),
        i.to("cpu:0"),
        x.softmax(-1).to("cpu:0"),
        F.cross_entropy(x, t, label_smoothing=0.1).to("cpu:0"),
        x.t().var(1).to("cpu:0"),
    ]
    summary = rec.finish(outs)
    assert summary["expects"] == len(outs) and summary["failure"] is None
    r = eagervm.replay(path)
    assert r["checked"] == len(outs) and r["failures"] == []
    r = eagervm.replay(path, device="cpu", resync=True)
    assert r["checked"] == len(outs) and r["failures"] == []


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32"])
def test_low_precision_normalisations_and_losses(vm, name):
    rng = np.random.default_rng(8)
    ref = rng.standard_normal((4, 6)).astype(np.float32)
    x = make(vm, ref, name)
    # The input as the array holds it (rounded to its dtype).
    r = read(x.float()).astype(np.float64)
    tol = {"float16": 2e-3, "bfloat16": 2e-2, "float32": 1e-5}[name]

    def near(got, want):
        assert got.dtype == x.dtype
        np.testing.assert_allclose(read(got.double()), want, rtol=tol, atol=tol)

    near(F.layer_norm(x, (6,)), (r - r.mean(1, keepdims=True)) / np.sqrt(r.var(1, keepdims=True) + 1e-5))
    near(x.softmax(1), np.exp(np_log_softmax(r, 1)))
    near(x.norm(dim=0), np.sqrt((r * r).sum(0)))
    near(x.logsumexp(1), np.log(np.exp(r).sum(1)))
    near(x.mean((0, 1)), r.mean())
    t = rng.integers(0, 6, 4)
    near(F.cross_entropy(x, vm.array(t)), np_cross_entropy(r, t))
