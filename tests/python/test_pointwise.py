"""Pointwise math against NumPy: unary math (every dtype, PyTorch's promotion of integers to
float32, NaN and infinities, 0-d, empty, strided and expanded inputs, in-place forms),
binary math (pow, maximum, remainder, rounding divisions, logical ops, alpha), the ternary
ops and clamps (where, clamp, lerp, addcmul, addcdiv) and the structured arrays (tril,
triu, one_hot, linspace, eye).

Tolerances: float64 results within 1e-12 relative of NumPy's float64; float32 within 4e-6
relative (a few ulps: the kernels compute in float32, the reference in float64 rounded
once); float16 2e-3 and bfloat16 1.6e-2 relative (one ulp of the 16-bit type, from the
float32 computation rounded once); each with an absolute floor of 1e-6 for values near 0.
Integer and comparison results, and floor, ceil, round, sign, abs and neg, are exact."""

import math

import numpy as np
import pytest

import eagervm
import eagervm.nn.functional as F
from helpers import BF16, DTYPES, make, np_dtype, read

FLOATS = ["float16", "bfloat16", "float32", "float64"]
INTS = ["uint8", "int32", "int64"]
RTOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 4e-6, "float64": 1e-12}

erf = np.vectorize(math.erf, otypes=[np.float64])

UNARY = {
    "exp": np.exp,
    "exp2": np.exp2,
    "log": np.log,
    "log2": np.log2,
    "log1p": np.log1p,
    "expm1": np.expm1,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "reciprocal": lambda x: 1.0 / x,
    "sin": np.sin,
    "cos": np.cos,
    "tanh": np.tanh,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "erf": erf,
}


def sample(rng, name, shape, special=True):
    """Values of dtype `name`: small numbers, and for floats NaN, ±inf and ±0."""
    if name == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if name == "uint8":
        return rng.integers(0, 12, shape).astype(np.uint8)
    if name in INTS:
        return rng.integers(-12, 12, shape).astype(name)
    v = rng.uniform(-4, 4, shape)
    if special and v.size >= 6:
        flat = v.reshape(-1)
        flat[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5]
    return v


def as_dtype(ref, name):
    """`ref` (float64) rounded to dtype `name`, returned as float64."""
    if name == "bfloat16":
        if BF16 is not None:
            return ref.astype(BF16).astype(np.float64)
        from helpers import round_bf16

        return round_bf16(ref.astype(np.float32)).astype(np.float64)
    return ref.astype(np_dtype(name)).astype(np.float64)


def close(got, want, name):
    got = np.asarray(got).astype(np.float64)
    want = np.asarray(want).astype(np.float64)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=RTOL[name], atol=1e-6, equal_nan=True)


def inputs_of(rng, vm, name, device):
    """(array, float64 reference) pairs: contiguous 2-D, 0-d, empty, transposed, a stepped
    slice and an expanded view."""
    base_ref = sample(rng, name, (4, 5))
    base = make(vm, base_ref.astype(np_dtype(name)), name, device)
    ref = read(base).astype(np.float64)
    out = [(base, ref)]
    z = make(vm, np.array(sample(rng, name, (), special=False)).astype(np_dtype(name)), name, device)
    out.append((z, read(z).astype(np.float64)))
    e = make(vm, np.zeros((0, 3), np_dtype(name)), name, device)
    out.append((e, np.zeros((0, 3))))
    out.append((base.t(), ref.T))
    out.append((base[::2, 1::2], ref[::2, 1::2]))
    row = base[1]
    out.append((row.expand(3, 5), np.broadcast_to(ref[1], (3, 5))))
    return out


@pytest.mark.parametrize("op", sorted(UNARY))
@pytest.mark.parametrize("name", DTYPES)
def test_float_unary_ops_against_numpy(vm, device, op, name):
    rng = np.random.default_rng(len(op) * 31 + DTYPES.index(name))
    out_name = name if name in FLOATS else "float32"
    for x, ref in inputs_of(rng, vm, name, device):
        got = getattr(x, op)()
        assert got.dtype == getattr(eagervm, out_name)
        assert got.shape == ref.shape
        with np.errstate(all="ignore"):
            want = as_dtype(UNARY[op](ref), out_name)
        close(read(got), want, out_name)
        # The module function computes the same.
        if op != "silu":
            close(read(getattr(eagervm, op)(x)), want, out_name)


@pytest.mark.parametrize("op", ["exp", "sigmoid", "tanh", "sqrt", "erf", "log1p"])
@pytest.mark.parametrize("name", FLOATS)
def test_float_unary_in_place_through_a_view(vm, device, op, name):
    rng = np.random.default_rng(7)
    ref = sample(rng, name, (3, 4))
    x = make(vm, ref.astype(np_dtype(name)), name, device)
    ref = read(x).astype(np.float64)
    col = x[:, 1]
    r = getattr(col, op + "_")()
    assert r is col
    with np.errstate(all="ignore"):
        ref[:, 1] = as_dtype(UNARY[op](ref[:, 1]), name)
    close(read(x), ref, name)


@pytest.mark.parametrize("name", ["bool"] + INTS)
def test_float_in_place_forms_refuse_integer_arrays(vm, name):
    x = make(vm, np.ones(3, np_dtype(name)), name)
    with pytest.raises(eagervm.InvalidOperandsError, match="cannot be cast"):
        x.exp_()


@pytest.mark.parametrize("name", FLOATS + ["int64"])
def test_gelu_both_forms_against_math_erf(vm, device, name):
    rng = np.random.default_rng(3)
    x = make(vm, sample(rng, name, (50,)).astype(np_dtype(name)), name, device)
    ref = read(x).astype(np.float64)
    out = name if name in FLOATS else "float32"
    with np.errstate(all="ignore"):
        exact = as_dtype(ref * 0.5 * (1.0 + erf(ref / math.sqrt(2.0))), out)
        inner = math.sqrt(2.0 / math.pi) * (ref + 0.044715 * ref**3)
        approx = as_dtype(0.5 * ref * (1.0 + np.tanh(inner)), out)
    close(read(F.gelu(x)), exact, out)
    # 1 + tanh(...) cancels for large negative x: a few float32 ulps of tanh.
    tol = dict(RTOL, float32=2e-5)
    np.testing.assert_allclose(read(F.gelu(x, approximate="tanh")).astype(np.float64), approx,
                               rtol=tol[out], atol=1e-6, equal_nan=True)
    with pytest.raises(eagervm.InvalidOperandsError):
        F.gelu(x, approximate="fast")


def test_functional_activations(vm, device):
    ref = np.linspace(-30, 30, 61)
    x = make(vm, ref.astype(np.float32), "float32", device)
    with np.errstate(all="ignore"):
        close(read(F.sigmoid(x)), 1 / (1 + np.exp(-ref)), "float32")
        close(read(F.tanh(x)), np.tanh(ref), "float32")
        close(read(F.silu(x)), ref / (1 + np.exp(-ref)), "float32")
        soft = np.where(ref > 20, ref, np.log1p(np.exp(ref)))
    close(read(F.softplus(x)), soft, "float32")
    y = x.clone()
    assert F.silu(y, inplace=True) is y
    close(read(y), ref / (1 + np.exp(-ref)), "float32")


NUMERIC = {
    "abs": np.abs,
    "neg": np.negative,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.round,
    "sign": lambda x: np.where(np.isnan(x), 0.0, np.sign(x)),
}


@pytest.mark.parametrize("op", sorted(NUMERIC))
@pytest.mark.parametrize("name", DTYPES)
def test_numeric_unary_ops_are_exact(vm, device, op, name):
    rng = np.random.default_rng(11)
    x = make(vm, sample(rng, name, (4, 5)).astype(np_dtype(name)), name, device)
    if name == "bool" and op != "sign":
        with pytest.raises(eagervm.InvalidOperandsError):
            getattr(x, op)()
        return
    ref = read(x)
    got = getattr(x, op)()
    assert got.dtype == x.dtype
    if name == "bool":
        np.testing.assert_array_equal(read(got), ref)
        return
    want = NUMERIC[op](ref.astype(np.float64) if name in FLOATS else ref)
    np.testing.assert_array_equal(read(got).astype(np.float64), np.asarray(want).astype(ref.dtype).astype(np.float64))
    # In place, through a transposed view.
    y = x.clone()
    getattr(y.t(), op + "_")()
    np.testing.assert_array_equal(read(y).astype(np.float64), np.asarray(want).astype(ref.dtype).astype(np.float64))


def test_round_halves_to_even_and_decimals(vm, device):
    x = vm.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 1.2345, 1234.5], device=device)
    np.testing.assert_array_equal(x.round().numpy(), np.round(x.numpy()))
    np.testing.assert_allclose(x.round(decimals=2).numpy(), np.round(x.numpy(), 2), rtol=1e-6)
    np.testing.assert_allclose(eagervm.round(x, decimals=-2).numpy(), np.round(x.numpy(), -2), rtol=1e-6)
    with pytest.raises(eagervm.InvalidOperandsError, match="decimals"):
        vm.tensor([1, 2]).round(decimals=1)


@pytest.mark.parametrize("name", DTYPES)
def test_predicates_and_logical_not(vm, device, name):
    rng = np.random.default_rng(5)
    x = make(vm, sample(rng, name, (3, 7)).astype(np_dtype(name)), name, device)
    ref = read(x).astype(np.float64)
    for op, f in [("isnan", np.isnan), ("isinf", np.isinf), ("isfinite", np.isfinite), ("logical_not", np.logical_not)]:
        got = getattr(x, op)()
        assert got.dtype == eagervm.bool
        np.testing.assert_array_equal(got.numpy(), f(ref))
        np.testing.assert_array_equal(getattr(eagervm, op)(x.t()).numpy(), f(ref.T))
    y = x.clone()
    y.logical_not_()
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(read(y).astype(np.float64), np.logical_not(ref).astype(np.float64))


# ---- Binary math.


def pair(rng, vm, name, device):
    """Two broadcasting arrays of dtype `name` and their references."""
    a = make(vm, sample(rng, name, (3, 1, 4)).astype(np_dtype(name)), name, device)
    b = make(vm, sample(rng, name, (2, 4), special=False).astype(np_dtype(name)), name, device)
    return a, b, read(a), read(b)


def int_pow(a, b):
    """PyTorch's integer pow: exact, wrapping to the dtype, for b >= 0; for b < 0, 1 for a
    base of 1, ±1 for -1 and 0 otherwise."""
    a, b = np.broadcast_arrays(a, b)
    bits = 8 * a.dtype.itemsize
    signed = a.dtype.kind == "i"
    out = np.empty(a.shape, a.dtype)
    for i in np.ndindex(a.shape):
        x, e = int(a[i]), int(b[i])
        if e < 0:
            v = 1 if x == 1 else (1 if e % 2 == 0 else -1) if x == -1 else 0
        else:
            v = pow(x, e) % (1 << bits)
            if signed and v >= 1 << (bits - 1):
                v -= 1 << bits
        out[i] = v
    return out


@pytest.mark.parametrize("name", DTYPES[1:])
def test_pow_tensors_and_scalars(vm, device, name):
    rng = np.random.default_rng(13)
    a, b, ra, rb = pair(rng, vm, name, device)
    if name in INTS:
        b = b.remainder(5) if name == "uint8" else b.clamp(-2, 6)
        rb = read(b)
        got = a.pow(b)
        assert got.dtype == a.dtype
        np.testing.assert_array_equal(read(got), int_pow(ra, rb))
        np.testing.assert_array_equal(read(a ** 3), int_pow(ra, np.array(3, ra.dtype)))
        if name != "uint8":
            with pytest.raises(eagervm.InvalidOperandsError, match="negative integer powers"):
                a ** -1
        # An integer array to a float power is float32.
        got = a ** 0.5
        assert got.dtype == eagervm.float32
        with np.errstate(all="ignore"):
            close(read(got), np.power(ra.astype(np.float64), 0.5), "float32")
        return
    with np.errstate(all="ignore"):
        close(read(a ** b), as_dtype(np.power(ra.astype(np.float64), rb.astype(np.float64)), name), name)
        close(read(a ** 2), as_dtype(np.power(ra.astype(np.float64), 2.0), name), name)
        close(read(2 ** a), as_dtype(np.power(2.0, ra.astype(np.float64)), name), name)
        close(read(eagervm.pow(2, a)), as_dtype(np.power(2.0, ra.astype(np.float64)), name), name)
    c = a.clone()
    c **= 2
    with np.errstate(all="ignore"):
        close(read(c), as_dtype(np.power(ra.astype(np.float64), 2.0), name), name)


@pytest.mark.parametrize("name", DTYPES)
def test_maximum_minimum_propagate_nan(vm, device, name):
    rng = np.random.default_rng(17)
    a, b, ra, rb = pair(rng, vm, name, device)
    for op, f in [("maximum", np.maximum), ("minimum", np.minimum)]:
        got = getattr(a, op)(b)
        assert got.dtype == a.dtype
        want = f(ra.astype(np.float64), rb.astype(np.float64))
        np.testing.assert_array_equal(read(got).astype(np.float64), want)
        np.testing.assert_array_equal(read(getattr(eagervm, op)(b, a)).astype(np.float64), want)
    # Promotion: int32 with float64 is float64.
    i = vm.tensor([1, 5], dtype=eagervm.int32, device=device)
    f = vm.tensor([2.5, float("nan")], dtype=eagervm.float64, device=device)
    m = i.maximum(f)
    assert m.dtype == eagervm.float64
    np.testing.assert_array_equal(m.numpy(), [2.5, np.nan])


@pytest.mark.parametrize("name", DTYPES[1:])
def test_remainder_fmod_and_rounding_divisions(vm, device, name):
    rng = np.random.default_rng(19)
    a, b, ra, rb = pair(rng, vm, name, device)
    if name in INTS:
        # No zero divisors here: those are tested below.
        b = b.where(b != 0, eagervm.ones_like(b) * 3)
        rb = read(b)
    fa, fb = ra.astype(np.float64), rb.astype(np.float64)
    with np.errstate(all="ignore"):
        cases = [
            (a.remainder(b), np.remainder(ra, rb) if name in INTS else np.remainder(fa, fb)),
            (a % b, np.remainder(ra, rb) if name in INTS else np.remainder(fa, fb)),
            (a.fmod(b), np.fmod(ra, rb) if name in INTS else np.fmod(fa, fb)),
            (a // b, np.floor_divide(ra, rb) if name in INTS else np.floor_divide(fa, fb)),
            (a.div(b, rounding_mode="floor"), np.floor_divide(ra, rb) if name in INTS else np.floor_divide(fa, fb)),
            (a.div(b, rounding_mode="trunc"), np.trunc(fa / fb)),
        ]
    for got, want in cases:
        assert got.dtype == a.dtype
        want = np.asarray(want)
        if name in FLOATS:
            close(read(got), as_dtype(want.astype(np.float64), name), name)
        else:
            np.testing.assert_array_equal(read(got), want.astype(ra.dtype))
    with pytest.raises(ValueError, match="rounding_mode"):
        a.div(b, rounding_mode="round")


def test_rounding_with_numbers_and_promotion(vm, device):
    x = vm.tensor([-7, -1, 0, 5, 7], device=device)
    np.testing.assert_array_equal((x % 3).numpy(), np.remainder(x.numpy(), 3))
    np.testing.assert_array_equal((x // -2).numpy(), np.floor_divide(x.numpy(), -2))
    np.testing.assert_array_equal((10 % x.clamp_min(1)).numpy(), np.remainder(10, np.maximum(x.numpy(), 1)))
    np.testing.assert_array_equal((10 // x.clamp_min(1)).numpy(), 10 // np.maximum(x.numpy(), 1))
    f = x % 2.5
    assert f.dtype == eagervm.float32
    np.testing.assert_allclose(f.numpy(), np.remainder(x.numpy(), 2.5))
    y = x.clone()
    y //= 2
    np.testing.assert_array_equal(y.numpy(), x.numpy() // 2)
    y = x.clone()
    y.div_(3, rounding_mode="trunc")
    np.testing.assert_array_equal(y.numpy(), np.trunc(x.numpy() / 3).astype(np.int64))
    with pytest.raises(eagervm.InvalidOperandsError, match="cannot be cast"):
        x.clone().remainder_(0.5)


@pytest.mark.parametrize("op", ["remainder", "fmod", "floor", "trunc"])
def test_integer_division_by_zero_raises_kernel_error(vm, device, op):
    x = vm.tensor([1, 2, 3], device=device)
    z = vm.tensor([1, 0, 1], device=device)
    if op in ("floor", "trunc"):
        r = x.div(z, rounding_mode=op)
    else:
        r = getattr(x, op)(z)
    with pytest.raises(eagervm.KernelError, match="integer division by zero"):
        r.numpy()
    # Floats divide by IEEE's rules.
    f = vm.tensor([1.0, -1.0, 0.0], device=device)
    q = f.div(vm.zeros(3, device=device), rounding_mode="floor").numpy()
    assert q[0] == np.inf and q[1] == -np.inf and np.isnan(q[2])


@pytest.mark.parametrize("na", DTYPES)
@pytest.mark.parametrize("nb", ["bool", "int32", "float32"])
def test_logical_ops_of_any_dtypes(vm, device, na, nb):
    rng = np.random.default_rng(23)
    a = make(vm, sample(rng, na, (2, 3)).astype(np_dtype(na)), na, device)
    b = make(vm, sample(rng, nb, (3,)).astype(np_dtype(nb)), nb, device)
    ra, rb = read(a).astype(np.float64), read(b).astype(np.float64)
    for op, f in [("logical_and", np.logical_and), ("logical_or", np.logical_or), ("logical_xor", np.logical_xor)]:
        got = getattr(a, op)(b)
        assert got.dtype == eagervm.bool
        np.testing.assert_array_equal(got.numpy(), f(ra, rb))
        np.testing.assert_array_equal(getattr(eagervm, op)(a, b).numpy(), f(ra, rb))


def test_add_and_sub_with_alpha(vm, device):
    a = vm.tensor([[1.0, 2.0], [3.0, 4.0]], device=device)
    b = vm.tensor([10.0, 20.0], device=device)
    np.testing.assert_allclose(a.add(b, alpha=0.5).numpy(), a.numpy() + 0.5 * b.numpy())
    np.testing.assert_allclose(a.sub(b, alpha=2).numpy(), a.numpy() - 2 * b.numpy())
    np.testing.assert_allclose(a.add(3, alpha=2).numpy(), a.numpy() + 6)
    i = vm.tensor([1, 2], device=device)
    np.testing.assert_array_equal(i.add(i, alpha=3).numpy(), [4, 8])
    with pytest.raises(eagervm.InvalidOperandsError, match="alpha"):
        i.add(i, alpha=0.5)
    c = a.clone()
    c.sub_(b, alpha=-1)
    np.testing.assert_allclose(c.numpy(), a.numpy() + b.numpy())


def test_atan2(vm, device):
    y = vm.tensor([1.0, -1.0, 0.0, 2.0], device=device)
    x = vm.tensor([[1.0], [-1.0]], device=device)
    close(y.atan2(x).numpy(), np.arctan2(y.numpy(), x.numpy()), "float32")
    i = vm.tensor([1, 2], device=device)
    assert eagervm.atan2(i, i).dtype == eagervm.float32


# ---- Ternary ops and clamps.


@pytest.mark.parametrize("name", DTYPES)
def test_where_broadcasts_and_takes_numbers(vm, device, name):
    rng = np.random.default_rng(29)
    cond_ref = rng.integers(0, 2, (2, 1, 3)).astype(bool)
    c = make(vm, cond_ref, "bool", device)
    x = make(vm, sample(rng, name, (4, 3)).astype(np_dtype(name)), name, device)
    y = make(vm, sample(rng, name, (3,)).astype(np_dtype(name)), name, device)
    rx, ry = read(x), read(y)
    got = eagervm.where(c, x, y)
    assert got.dtype == x.dtype and got.shape == (2, 4, 3)
    np.testing.assert_array_equal(read(got).astype(np.float64), np.where(cond_ref, rx, ry).astype(np.float64))
    np.testing.assert_array_equal(read(x.where(c, y)).astype(np.float64), np.where(cond_ref, rx, ry).astype(np.float64))
    # A number: PyTorch's promotion of the two.
    got = eagervm.where(c, x, 0.5)
    want_name = name if name in FLOATS else "float32"
    assert got.dtype == getattr(eagervm, want_name)
    close(read(got), as_dtype(np.where(cond_ref, rx.astype(np.float64), 0.5), want_name), want_name)
    if name != "bool":
        with pytest.raises(eagervm.InvalidOperandsError, match="bool condition"):
            eagervm.where(x, x, y)


@pytest.mark.parametrize("name", DTYPES[1:])
def test_clamp_with_numbers_and_arrays(vm, device, name):
    rng = np.random.default_rng(31)
    x = make(vm, sample(rng, name, (3, 4)).astype(np_dtype(name)), name, device)
    rx = read(x).astype(np.float64)
    np.testing.assert_array_equal(read(x.clamp(1, 5)).astype(np.float64), np.clip(rx, 1, 5))
    np.testing.assert_array_equal(read(x.clamp(min=2)).astype(np.float64), np.maximum(rx, 2))
    np.testing.assert_array_equal(read(x.clip(max=3)).astype(np.float64), np.minimum(rx, 3))
    np.testing.assert_array_equal(
        read(eagervm.clamp(x, 5, 1)).astype(np.float64), np.where(np.isnan(rx), np.nan, 1.0)
    )
    lo = make(vm, sample(rng, name, (4,), special=False).astype(np_dtype(name)), name, device)
    hi = lo + 3
    rlo, rhi = read(lo).astype(np.float64), read(hi).astype(np.float64)
    np.testing.assert_array_equal(read(x.clamp(lo, hi)).astype(np.float64), np.minimum(np.maximum(rx, rlo), rhi))
    np.testing.assert_array_equal(read(x.clamp_min(lo)).astype(np.float64), np.maximum(rx, rlo))
    np.testing.assert_array_equal(read(x.clamp(None, hi)).astype(np.float64), np.minimum(rx, rhi))
    y = x.clone()
    y.t().clamp_(0, 4)
    np.testing.assert_array_equal(read(y).astype(np.float64), np.clip(rx, 0, 4))
    if name in INTS:
        # A float bound makes an integer array's result float32, as PyTorch.
        assert x.clamp(0.5).dtype == eagervm.float32
        with pytest.raises(eagervm.InvalidOperandsError, match="cannot be cast"):
            x.clone().clamp_(0.5)
    with pytest.raises(eagervm.InvalidOperandsError, match="at least one"):
        x.clamp()


@pytest.mark.parametrize("name", FLOATS)
def test_lerp_addcmul_addcdiv(vm, device, name):
    rng = np.random.default_rng(37)
    mk = lambda shape: make(vm, sample(rng, name, shape, special=False).astype(np_dtype(name)), name, device)
    a, b, w = mk((2, 3)), mk((3,)), mk((2, 1))
    ra, rb, rw = (read(t).astype(np.float64) for t in (a, b, w))
    d = rb - ra
    want = np.where(np.abs(rw) < 0.5, ra + rw * d, rb - d * (1 - rw))
    close(read(a.lerp(b, w)), as_dtype(want, name), name)
    want = np.where(abs(0.75) < 0.5, ra + 0.75 * d, rb - d * (1 - 0.75))
    close(read(eagervm.lerp(a, b, 0.75)), as_dtype(want, name), name)
    close(read(a.addcmul(b, w, value=0.5)), as_dtype(ra + 0.5 * rb * rw, name), name)
    nz = w.abs() + 1
    rnz = read(nz).astype(np.float64)
    close(read(eagervm.addcdiv(a, b, nz, value=2)), as_dtype(ra + 2 * rb / rnz, name), name)
    c = a.clone()
    c.addcmul_(b, w, value=-1)
    close(read(c), as_dtype(ra - rb * rw, name), name)
    c = a.clone()
    c.lerp_(b, 0.25)
    close(read(c), as_dtype(ra + 0.25 * d, name), name)


def test_addcmul_of_integers_and_addcdiv_refusal(vm, device):
    x = vm.tensor([1, 2, 3], device=device)
    np.testing.assert_array_equal(x.addcmul(x, x, value=2).numpy(), [3, 10, 21])
    with pytest.raises(eagervm.InvalidOperandsError, match="value"):
        x.addcmul(x, x, value=0.5)
    with pytest.raises(eagervm.InvalidOperandsError, match="addcdiv"):
        x.addcdiv(x, x)
    with pytest.raises(eagervm.InvalidOperandsError, match="floating"):
        x.lerp(x, 0.5)


# ---- Structured arrays.


@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("k", [-2, -1, 0, 1, 3])
def test_tril_triu_of_a_batch(vm, device, name, k):
    rng = np.random.default_rng(41)
    x = make(vm, sample(rng, name, (2, 3, 4), special=False).astype(np_dtype(name)), name, device)
    r = read(x)
    np.testing.assert_array_equal(read(x.tril(k)), np.tril(r, k))
    np.testing.assert_array_equal(read(eagervm.triu(x, diagonal=k)), np.triu(r, k))
    np.testing.assert_array_equal(read(x.transpose(1, 2).triu(k)), np.triu(r.transpose(0, 2, 1), k))
    y = x.clone()
    y.tril_(k)
    np.testing.assert_array_equal(read(y), np.tril(r, k))
    with pytest.raises(eagervm.InvalidOperandsError, match="at least 2 dimensions"):
        x[0, 0].tril()


def test_one_hot(vm, device):
    x = vm.tensor([[0, 3], [2, 1]], device=device)
    got = F.one_hot(x, num_classes=5)
    assert got.dtype == eagervm.int64 and got.shape == (2, 2, 5)
    np.testing.assert_array_equal(got.numpy(), np.eye(5, dtype=np.int64)[x.numpy()])
    np.testing.assert_array_equal(F.one_hot(x).numpy(), np.eye(4, dtype=np.int64)[x.numpy()])
    np.testing.assert_array_equal(F.one_hot(x.t(), 4).numpy(), np.eye(4, dtype=np.int64)[x.numpy().T])
    with pytest.raises(eagervm.KernelError, match="outside 0..3"):
        F.one_hot(x, 3).numpy()
    with pytest.raises(eagervm.InvalidOperandsError):
        F.one_hot(vm.tensor([1.0]))


def test_linspace_and_eye(vm, device):
    for start, end, steps in [(0.0, 1.0, 5), (-3.0, 7.0, 11), (2.0, 2.0, 1), (1.0, -1.0, 4), (0.0, 1.0, 0)]:
        got = eagervm.linspace(start, end, steps, device=device, vm=vm)
        assert got.dtype == eagervm.float32
        np.testing.assert_allclose(got.numpy(), np.linspace(start, end, steps), rtol=1e-6, atol=1e-7)
    got = eagervm.linspace(0, 10, 5, dtype=eagervm.int64, device=device, vm=vm)
    np.testing.assert_array_equal(got.numpy(), [0, 2, 5, 7, 10])
    np.testing.assert_array_equal(eagervm.eye(3, device=device, vm=vm).numpy(), np.eye(3))
    np.testing.assert_array_equal(eagervm.eye(2, 4, dtype=eagervm.int32, device=device, vm=vm).numpy(), np.eye(2, 4))
    assert eagervm.eye(0, 3).shape == (0, 3)
