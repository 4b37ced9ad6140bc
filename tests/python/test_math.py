"""Arithmetic and comparisons against NumPy, with PyTorch's type promotion: broadcasting
arrays of every pair of dtypes, numbers on either side, 0-d arrays, in-place forms
through views, and the refusals PyTorch makes (a float result into an integer array, a
bool subtraction, a shape that does not broadcast)."""

import itertools
import operator

import numpy as np
import pytest

import eagervm
from helpers import BF16, DTYPES, assert_same, make, np_dtype, read, round_bf16, values

# torch.promote_types for eagervm's dtypes, written out from PyTorch's table: within a
# category the wider type; u8 with a signed integer the signed one; an integer with a
# float the float; float16 with bfloat16 float32; bool with anything that thing.
PROMOTE = {
    ("bool", "uint8"): "uint8",
    ("bool", "int32"): "int32",
    ("bool", "int64"): "int64",
    ("bool", "float16"): "float16",
    ("bool", "bfloat16"): "bfloat16",
    ("bool", "float32"): "float32",
    ("bool", "float64"): "float64",
    ("uint8", "int32"): "int32",
    ("uint8", "int64"): "int64",
    ("uint8", "float16"): "float16",
    ("uint8", "bfloat16"): "bfloat16",
    ("uint8", "float32"): "float32",
    ("uint8", "float64"): "float64",
    ("int32", "int64"): "int64",
    ("int32", "float16"): "float16",
    ("int32", "bfloat16"): "bfloat16",
    ("int32", "float32"): "float32",
    ("int32", "float64"): "float64",
    ("int64", "float16"): "float16",
    ("int64", "bfloat16"): "bfloat16",
    ("int64", "float32"): "float32",
    ("int64", "float64"): "float64",
    ("float16", "bfloat16"): "float32",
    ("float16", "float32"): "float32",
    ("float16", "float64"): "float64",
    ("bfloat16", "float32"): "float32",
    ("bfloat16", "float64"): "float64",
    ("float32", "float64"): "float64",
}


def promote(a, b):
    if a == b:
        return a
    return PROMOTE.get((a, b)) or PROMOTE[(b, a)]


def category(d):
    return 0 if d == "bool" else 1 if d in ("uint8", "int32", "int64") else 2


def result_type(*operands):
    """PyTorch's result_type: operands are ("tensor", dtype, rank) or ("scalar", kind);
    dimensioned tensors, then 0-d tensors, then numbers, each tier deciding only where it
    is of a higher category than those above it."""
    tiers = [None, None, None]
    for o in operands:
        if o[0] == "scalar":
            t, d = 2, {"bool": "bool", "int": "int64", "float": "float32"}[o[1]]
        else:
            t, d = (0 if o[2] > 0 else 1), o[1]
        tiers[t] = d if tiers[t] is None else promote(tiers[t], d)
    out = None
    for d in tiers:
        if d is None:
            continue
        if out is None or category(d) > category(out):
            out = d if out is None else promote(out, d)
    return out


def test_the_expected_table_says_what_pytorch_s_documentation_says():
    # The examples of PyTorch's type promotion documentation.
    assert result_type(("tensor", "int32", 1), ("scalar", "int")) == "int32"
    assert result_type(("tensor", "int32", 1), ("tensor", "int64", 0)) == "int32"
    assert result_type(("tensor", "int64", 1), ("tensor", "int32", 1)) == "int64"
    assert result_type(("tensor", "bool", 1), ("tensor", "int64", 1)) == "int64"
    assert result_type(("tensor", "bool", 1), ("tensor", "uint8", 1)) == "uint8"
    assert result_type(("tensor", "float32", 1), ("tensor", "float64", 1)) == "float64"
    assert result_type(("tensor", "int64", 1), ("tensor", "float32", 1)) == "float32"
    assert result_type(("tensor", "int32", 1), ("scalar", "float")) == "float32"
    assert result_type(("tensor", "int32", 1), ("tensor", "float64", 0)) == "float64"
    assert result_type(("tensor", "float16", 1), ("scalar", "float")) == "float16"
    assert result_type(("tensor", "uint8", 1), ("tensor", "int32", 1)) == "int32"
    assert result_type(("scalar", "int"), ("scalar", "int")) == "int64"


def as_np(ref, name):
    """A NumPy reference of dtype `name` as the values eagervm computes with (bfloat16 as
    float32 without ml_dtypes)."""
    return ref.astype(np_dtype(name))


def expected(op, a, b, rt):
    """NumPy's `a op b`, both operands (arrays or numbers) first converted to `rt` (PyTorch
    converts them to the result type; a true division of integers to the default float)."""
    compute = "float32" if op is operator.truediv and category(rt) < 2 else rt
    x = np.asarray(a).astype(np_dtype(compute))
    y = np.asarray(b).astype(np_dtype(compute))
    with np.errstate(all="ignore"):
        if compute == "bfloat16" and BF16 is None:
            out = op(x, y)
            return out if out.dtype == bool else round_bf16(out)
        return op(x, y)


def store(ref, want, name):
    """`ref[...] = want` as an array of dtype `name` stores it."""
    if name == "bfloat16" and BF16 is None:
        ref[...] = round_bf16(np.asarray(want).astype(np.float32))
    else:
        ref[...] = np.asarray(want).astype(ref.dtype)


ARITH = [operator.add, operator.sub, operator.mul, operator.truediv]
COMPARE = [operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge]


def broadcast_pair(rng):
    """Two shapes that broadcast, of rank 0 to 3."""
    out = tuple(int(rng.integers(1, 4)) for _ in range(int(rng.integers(0, 4))))
    a = tuple(1 if rng.random() < 0.3 else d for d in out[len(out) - int(rng.integers(0, len(out) + 1)) :])
    b = tuple(1 if rng.random() < 0.3 else d for d in out[len(out) - int(rng.integers(0, len(out) + 1)) :])
    return a, b


def check(got, want, rt):
    assert str(got.dtype) == f"eagervm.{rt}" or got.dtype == getattr(eagervm, rt), (got.dtype, rt)
    assert got.shape == np.shape(want)
    r = read(got)
    assert_same(r, np.asarray(want).astype(r.dtype))


@pytest.mark.parametrize("an, bn", list(itertools.product(DTYPES, DTYPES)))
def test_arrays_of_every_pair_of_dtypes_broadcast_and_promote(vm, an, bn):
    rng = np.random.default_rng(hash((an, bn)) % 2**32)
    for op in ARITH + COMPARE:
        sa, sb = broadcast_pair(rng)
        a, b = values(rng, sa, an), values(rng, sb, bn)
        x, y = make(vm, a, an), make(vm, b, bn)
        rt = result_type(("tensor", an, len(sa)), ("tensor", bn, len(sb)))
        if op is operator.sub and rt == "bool":
            with pytest.raises(ValueError, match="bool"):
                op(x, y)
            continue
        want = expected(op, a, b, rt)
        if op in COMPARE:
            check(op(x, y), want, "bool")
        else:
            out_dt = "float32" if op is operator.truediv and category(rt) < 2 else rt
            check(op(x, y), want, out_dt)
        assert eagervm.result_type(x, y) == getattr(eagervm, rt)


@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("scalar", [True, 3, 2.5, -1.25, 0])
def test_numbers_on_either_side(vm, device, name, scalar):
    rng = np.random.default_rng(5)
    a = values(rng, (2, 3), name)
    x = make(vm, a, name, device)
    kind = "bool" if isinstance(scalar, bool) else "int" if isinstance(scalar, int) else "float"
    rt = result_type(("tensor", name, 2), ("scalar", kind))
    assert eagervm.result_type(x, scalar) == getattr(eagervm, rt)
    for op in ARITH + COMPARE:
        for reflected in (False, True):
            f = (lambda u, v: op(v, u)) if reflected else op
            if op is operator.sub and rt == "bool":
                with pytest.raises(ValueError, match="bool"):
                    f(x, scalar)
                continue
            got = f(x, scalar)
            if op in COMPARE:
                # A comparison with a number is exact (the number is not rounded first).
                want = f(a.astype(np.float64), scalar)
                check(got, want, "bool")
                continue
            want = expected(op, scalar, a, rt) if reflected else expected(op, a, scalar, rt)
            out_dt = "float32" if op is operator.truediv and category(rt) < 2 else rt
            check(got, want, out_dt)
            assert got.device == device


def test_zero_dim_arrays_promote_as_pytorch_s(vm):
    i32 = vm.tensor([1, 2, 3], dtype=eagervm.int32)
    u8 = vm.tensor([1, 2], dtype=eagervm.uint8)
    assert (i32 + vm.tensor(5)).dtype == eagervm.int32  # a 0-d int64 does not widen it
    assert (u8 + vm.tensor(300)).dtype == eagervm.uint8
    assert (i32 + vm.tensor(2.5, dtype=eagervm.float64)).dtype == eagervm.float64  # a higher category does
    assert (vm.tensor([1.0], dtype=eagervm.float16) * vm.tensor(2.0, dtype=eagervm.float64)).dtype == eagervm.float16
    assert (vm.tensor(1, dtype=eagervm.int32) + vm.tensor(1)).dtype == eagervm.int64  # two 0-d promote
    assert (vm.tensor(1, dtype=eagervm.int32) + 2.5).dtype == eagervm.float32
    assert (vm.tensor([True]) + vm.tensor(3)).dtype == eagervm.int64
    assert (vm.tensor([True]) + True).dtype == eagervm.bool
    assert (vm.tensor([True, False]) + vm.tensor([True, True])).tolist() == [True, True]  # or
    assert (vm.tensor([True, False]) * vm.tensor([True, True])).tolist() == [True, False]  # and
    assert (vm.tensor([1, 2]) / vm.tensor([2, 4])).dtype == eagervm.float32
    assert (vm.tensor([1, 2]) / vm.tensor([2, 4])).tolist() == [0.5, 0.5]


def test_promotion_functions():
    f = eagervm
    assert f.promote_types(f.uint8, f.int32) is f.int32
    assert f.promote_types(f.float16, f.bfloat16) is f.float32
    assert f.promote_types("int64", np.float16) is f.float16
    assert f.can_cast(f.int64, f.float16) and f.can_cast(f.bool, f.int32)
    assert not f.can_cast(f.float32, f.int64) and not f.can_cast(f.int32, f.bool)
    assert f.get_default_dtype() is f.float32
    for a, b in itertools.product(DTYPES, DTYPES):
        assert f.promote_types(getattr(f, a), getattr(f, b)) is getattr(f, promote(a, b))


@pytest.mark.parametrize("name", DTYPES)
def test_in_place_forms_write_through_views(vm, device, name):
    rng = np.random.default_rng(6)
    for other in DTYPES:
        a = values(rng, (3, 4), name)
        x = make(vm, a, name, device)
        v, av = x[1:, ::2], a[1:, ::2]
        b = values(rng, (2,), other)
        y = make(vm, b, other, device)
        for op, iop in [(operator.add, operator.iadd), (operator.mul, operator.imul), (operator.sub, operator.isub), (operator.truediv, operator.itruediv)]:
            rt = result_type(("tensor", name, 2), ("tensor", other, 1))
            if op is operator.truediv and category(rt) < 2:
                rt = "float32"
            refused = category(rt) > category(name) or (op is operator.sub and rt == "bool")
            if refused:
                with pytest.raises(ValueError):
                    iop(v, y)
                assert_same(read(x), a)
                continue
            w = iop(v, y)
            assert w is v  # in place: the same object
            store(av, expected(op, av, b, rt), name)
            assert_same(read(x), a, err_msg=f"{name} {op.__name__}= {other}")


def test_in_place_methods_return_the_array_and_refuse_a_wider_result(vm):
    x = vm.tensor([1, 2, 3], dtype=eagervm.int32)
    assert x.add_(2) is x and x.tolist() == [3, 4, 5]
    assert x.mul_(vm.tensor([2, 2, 2])) is x and x.tolist() == [6, 8, 10]
    assert x.sub_(1) is x and x.tolist() == [5, 7, 9]
    with pytest.raises(eagervm.InvalidOperandsError, match="cannot be cast") as e:
        x.add_(1.5)
    assert isinstance(e.value, ValueError)
    with pytest.raises(ValueError, match="cannot be cast"):
        x.div_(2)
    with pytest.raises(ValueError, match="broadcast shape"):
        x.add_(vm.zeros(2, 3, dtype=eagervm.int32))
    f = vm.tensor([1.0, 2.0])
    f /= 4
    assert f.tolist() == [0.25, 0.5]
    assert x.fill_(7) is x and x.tolist() == [7, 7, 7]
    assert x.zero_() is x and x.tolist() == [0, 0, 0]
    assert x.copy_(vm.tensor([1.9, -2.9, 3.0])) is x and x.tolist() == [1, -2, 3]
    assert x.copy_(vm.tensor(4)) is x and x.tolist() == [4, 4, 4]  # broadcast


def test_masked_fill_and_relu(vm, device):
    a = np.array([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0]], np.float32)
    x = vm.array(a, device)
    m = x < 0
    np.testing.assert_array_equal(x.masked_fill(m, 0.5).numpy(), np.where(a < 0, 0.5, a))
    np.testing.assert_array_equal(x.masked_fill(vm.tensor([True, False, False], device=device), 9).numpy(), np.where([True, False, False], 9, a))
    np.testing.assert_array_equal(x.relu().numpy(), np.maximum(a, 0))
    assert x.masked_fill_(m, vm.tensor(0.0)) is x
    np.testing.assert_array_equal(x.numpy(), np.maximum(a, 0))
    x[0].relu_()
    assert (-x).relu_() is not None
    with pytest.raises(ValueError, match="bool"):
        -vm.tensor([True])


def test_matmul_promotes_and_takes_views(vm, device):
    rng = np.random.default_rng(7)
    a = rng.integers(-3, 4, (5, 3)).astype(np.float32)
    b = rng.integers(-3, 4, (4, 5)).astype(np.int64)
    x, y = vm.array(a, device), vm.array(b, device)
    r = x.t() @ y.t()
    assert r.dtype == eagervm.float32
    np.testing.assert_array_equal(r.numpy(), a.T @ b.T.astype(np.float32))
    np.testing.assert_array_equal(x[::2].matmul(y[:3, :3].double()).numpy(), a[::2] @ b[:3, :3].astype(np.float64))


def test_sum_and_its_dims(vm):
    x = vm.tensor([[1, 2], [3, 4]], dtype=eagervm.int32)
    assert x.sum().dtype == eagervm.int64 and x.sum().item() == 10
    assert x.sum(dtype=eagervm.float64).dtype == eagervm.float64
    assert vm.tensor([True, True, False]).sum().item() == 2
    assert x.sum(0).tolist() == [4, 6]
    assert x.sum(dim=1, keepdim=True).tolist() == [[3], [7]]


def test_mismatched_operands_are_refused(vm):
    x = vm.zeros(2, 3)
    with pytest.raises(ValueError, match="do not broadcast"):
        x + vm.zeros(3, 2)
    with pytest.raises(ValueError, match="do not broadcast"):
        x == vm.zeros(4)
    with pytest.raises(eagervm.WrongDeviceError):
        x + vm.zeros(2, 3, device="mock:0")
    with pytest.raises(ValueError, match="64 bits"):
        x + 2**64
    assert (x == "text") is False and (x != None) is True  # noqa: E711 (not an operand: identity)
    with pytest.raises(TypeError):
        x < "text"
    assert hash(x) == hash(x) and len({x, x}) == 1
