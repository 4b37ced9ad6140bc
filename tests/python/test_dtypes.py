"""The dtype objects, and values of every dtype to and from NumPy (`numpy()`,
`__array__`, `vm.array`, `from_numpy`, `tensor`) and DLPack, with and without ml_dtypes
for bfloat16."""

import os
import pathlib
import pickle
import subprocess
import sys

import numpy as np
import pytest

import eagervm
from helpers import BF16, DTYPES, assert_same, make, np_dtype, read, values

HERE = pathlib.Path(__file__).resolve().parent
NEEDS_ML_DTYPES = "ml_dtypes is not installed (optional; bfloat16 is checked without it in test_bfloat16_without_ml_dtypes)"


def test_dtype_objects_are_pytorch_s_and_equal_numpy_s():
    for name in DTYPES:
        d = getattr(eagervm, name)
        assert isinstance(d, eagervm.dtype)
        assert repr(d) == f"eagervm.{name}"
        assert d == d and not (d != d) and d is getattr(eagervm, name)
        assert pickle.loads(pickle.dumps(d)) is d
        if name != "bfloat16" or BF16 is not None:
            assert d == np.dtype(name) and np.dtype(name) == d
            assert hash(d) == hash(np.dtype(name))
            assert {np.dtype(name): 1}[d] == 1
            assert np.dtype(d.numpy_dtype) == np.dtype(name)
    assert eagervm.float32 == np.float32 and eagervm.int64 == np.int64 and eagervm.bool == np.bool_
    assert eagervm.float32 != np.float64 and eagervm.float32 != eagervm.float64
    assert eagervm.float32 != "not a dtype" and eagervm.int32 != None  # noqa: E711
    assert eagervm.float is eagervm.float32 and eagervm.double is eagervm.float64
    assert eagervm.half is eagervm.float16 and eagervm.int is eagervm.int32 and eagervm.long is eagervm.int64
    assert eagervm.float32.is_floating_point and not eagervm.int32.is_floating_point
    assert eagervm.float16.itemsize == 2 and eagervm.bool.itemsize == 1
    assert eagervm.int32.is_signed and not eagervm.uint8.is_signed
    assert len({eagervm.float32, eagervm.float32, eagervm.int64}) == 2


def test_devices():
    d = eagervm.device("mock:1")
    assert d.type == "mock" and d.index == 1 and str(d) == "mock:1"
    assert d == "mock:1" and d == eagervm.device("mock", 1) and d != "mock:0"
    assert eagervm.device("cpu") == "cpu:0" and eagervm.device(0) == "cuda:0"
    assert pickle.loads(pickle.dumps(d)) == d
    with pytest.raises(ValueError, match="unknown device"):
        eagervm.device("gpu:0")


@pytest.mark.parametrize("name", DTYPES)
def test_numpy_round_trips(vm, device, name):
    if name == "bfloat16" and BF16 is None:
        pytest.skip(NEEDS_ML_DTYPES)
    rng = np.random.default_rng(1)
    for shape in [(), (0,), (3,), (2, 3, 4)]:
        a = values(rng, shape, name)
        x = vm.array(a, device)
        assert x.dtype == getattr(eagervm, name) and x.shape == shape
        for back in (x.numpy(), np.asarray(x), np.array(x)):
            assert back.dtype == np.dtype(np_dtype(name)) and back.shape == shape
            assert_same(back, a)
        # Non-contiguous and other byte orders are copied as they read.
        if a.ndim == 3:
            assert_same(vm.array(a[:, ::2, 1:]).numpy(), a[:, ::2, 1:])
            assert_same(vm.array(a.transpose(2, 0, 1)).numpy(), a.transpose(2, 0, 1))
        if name not in ("bool", "uint8", "bfloat16"):
            swapped = a.astype(a.dtype.newbyteorder(">"))
            assert_same(vm.array(swapped).numpy(), a)
        with vm:
            assert_same(eagervm.tensor(a, device=device).numpy(), a)
        assert_same(np.asarray(x, dtype=np.float64), a.astype(np.float64))
        assert x.tolist() == (a.astype(np.float32) if name == "bfloat16" else a).tolist()


@pytest.mark.parametrize("name", DTYPES)
def test_from_numpy_shares_memory_where_it_can(vm, name):
    if name == "bfloat16" and BF16 is None:
        pytest.skip(NEEDS_ML_DTYPES)
    a = values(np.random.default_rng(2), (4,), name)
    with vm:
        x = eagervm.from_numpy(a)
    assert x.dtype == getattr(eagervm, name)
    before = a.copy()
    a[0] = np.ones((), a.dtype) if a[0] == 0 else np.zeros((), a.dtype)
    x.wait()
    if name == "bfloat16":
        # NumPy has no DLPack export of bfloat16: a copy, which the write does not reach.
        assert_same(read(x), before)
    else:
        assert_same(read(x), a)  # the same memory, as PyTorch's from_numpy shares it
    with pytest.raises(TypeError, match="numpy.ndarray"):
        eagervm.from_numpy([1, 2])


@pytest.mark.parametrize("name", DTYPES)
def test_dlpack_both_ways(vm, name):
    rng = np.random.default_rng(3)
    a = values(rng, (2, 3), name)
    x = make(vm, a, name)
    if name == "bfloat16" and BF16 is None:
        # NumPy cannot take bfloat16 through DLPack; eagervm can, both ways.
        y = vm.from_dlpack(x)
        assert y.dtype == eagervm.bfloat16
        assert_same(read(y), a)
        return
    if name == "bfloat16":
        # NumPy has no DLPack bfloat16 even with ml_dtypes: eagervm to eagervm.
        y = vm.from_dlpack(x)
        assert_same(read(y), a)
        return
    back = np.from_dlpack(x)
    assert back.dtype == np.dtype(name)
    assert_same(back, a)
    y = vm.from_dlpack(back)
    assert y.dtype == getattr(eagervm, name)
    assert_same(read(y), a)
    # A view is exported as it lies (strides and offset), without a copy.
    v = x[1, ::2]
    nv = np.from_dlpack(v)
    assert_same(nv, a[1, ::2])
    assert nv.strides == tuple(s * a.itemsize for s in v.stride())
    x.fill_(True if name == "bool" else 5)
    x.wait()
    assert_same(nv, np.full(2, True if name == "bool" else 5, dtype=np.dtype(name)))


def test_tensor_infers_pytorch_s_dtypes(vm):
    cases = [
        ([1, 2], eagervm.int64),
        ([1.0, 2], eagervm.float32),
        ([True, False], eagervm.bool),
        ([True, 2], eagervm.int64),
        ([[1, 2.5], [3, 4]], eagervm.float32),
        (3, eagervm.int64),
        (2.5, eagervm.float32),
        (True, eagervm.bool),
        ([], eagervm.float32),
        (np.array([1.0, 2.0]), eagervm.float64),  # a NumPy array keeps its dtype
        (np.array([1, 2], np.int32), eagervm.int32),
        (np.float16(1.5), eagervm.float16),
    ]
    for data, want in cases:
        x = vm.tensor(data)
        assert x.dtype is want, (data, x.dtype, want)
        assert_same(read(x), np.asarray(data))
    assert vm.tensor([1.7, -1.7], dtype=eagervm.int32).tolist() == [1, -1]
    assert vm.tensor([1, 2], dtype=eagervm.bfloat16).dtype is eagervm.bfloat16
    assert vm.tensor(vm.tensor([1, 2]), dtype=eagervm.float64).tolist() == [1.0, 2.0]
    s = vm.tensor(2.5)
    assert s.shape == () and s.item() == 2.5 and float(s) == 2.5 and int(s) == 2 and bool(s)
    assert f"{s:.2f}" == "2.50"
    with pytest.raises(TypeError, match="numbers"):
        vm.tensor(["a", "b"])
    with pytest.raises(TypeError):
        vm.tensor([[1, 2], [3]])
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(vm.tensor([1, 2]))


@pytest.mark.parametrize("name", DTYPES)
def test_items_conversions_and_repr(vm, name):
    a = values(np.random.default_rng(4), (3,), name)
    x = make(vm, a, name)
    v = x[0].item()
    assert type(v) is {"bool": bool, "uint8": int, "int32": int, "int64": int}.get(name, float)
    assert v == a[0]
    for other in DTYPES:
        y = x.to(getattr(eagervm, other))
        assert y.dtype is getattr(eagervm, other)
        # Small integers survive every conversion but to bool, which keeps whether nonzero.
        want = a.astype(np.float64) if other != "bool" else (a != 0)
        assert_same(read(y).astype(np.float64), want.astype(np.float64))
        assert_same(read(y.to(x.dtype)).astype(np.float64), want.astype(np.float64))
    assert x.to(x.dtype) is x and x.to(x.dtype, copy=True) is not x
    r = repr(x)
    assert r.startswith("tensor([")
    assert ("dtype=eagervm." + name in r) == (name not in ("float32", "int64", "bool"))
    assert repr(x.to("mock:0")).endswith(f"device='mock:0'{', dtype=eagervm.' + name if name not in ('float32', 'int64', 'bool') else ''})")


def test_conversion_shorthands(vm):
    x = vm.tensor([1.5, -2.5])
    for method, d in [("float", "float32"), ("double", "float64"), ("half", "float16"), ("bfloat16", "bfloat16"),
                      ("int", "int32"), ("long", "int64"), ("bool", "bool"), ("byte", "uint8")]:
        assert getattr(x, method)().dtype is getattr(eagervm, d)
    assert x.float() is x and x.cpu() is x
    m = x.to("mock:0")
    assert m.device == "mock:0" and m.cpu().device == "cpu:0"
    y = x.to(eagervm.device("mock:1"), eagervm.float64)
    assert y.device == "mock:1" and y.dtype is eagervm.float64
    z = vm.zeros(1, dtype=eagervm.int32, device="mock:0")
    w = x.to(z)
    assert w.device == "mock:0" and w.dtype is eagervm.int32 and w.tolist() == [1, -2]
    assert x.to(device="mock:0", dtype=eagervm.float16).dtype is eagervm.float16
    with pytest.raises(eagervm.DeviceError):
        x.cuda()


def test_repr_of_what_cannot_be_read(vm):
    assert repr(vm.empty(2)) == "tensor(<uninitialized>, size=(2,))"
    (bad,) = vm.call("fail", [], outputs=[([2], np.float32)], scalar=3)
    assert repr(bad).startswith("tensor(<KernelError:")
    with pytest.raises(eagervm.FailedError):
        vm.sync()
    assert repr(vm.zeros(0, 3)) == "tensor([], size=(0, 3))"


def test_bfloat16_without_ml_dtypes():
    """bfloat16 works without ml_dtypes: values through float32, DLPack, and a clear error
    where NumPy would need the type."""
    code = r"""
import sys
sys.modules["ml_dtypes"] = None  # as if not installed
import numpy as np, eagervm, pytest
vm = eagervm.VM()
x = vm.tensor([1.5, -2.25, 3.0], dtype=eagervm.bfloat16)
assert x.dtype is eagervm.bfloat16
assert x.tolist() == [1.5, -2.25, 3.0]
assert x[1].item() == -2.25
assert x.float().numpy().tolist() == [1.5, -2.25, 3.0]
assert (x * 2).float().tolist() == [3.0, -4.5, 6.0]
assert "dtype=eagervm.bfloat16" in repr(x)
assert vm.from_dlpack(x).tolist() == [1.5, -2.25, 3.0]
with pytest.raises(TypeError, match="ml_dtypes"):
    x.numpy()
with pytest.raises(TypeError, match="ml_dtypes"):
    eagervm.bfloat16.numpy_dtype
assert hash(eagervm.bfloat16) == hash("bfloat16")
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=HERE, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


@pytest.mark.skipif(BF16 is None, reason=NEEDS_ML_DTYPES)
def test_bfloat16_with_ml_dtypes(vm):
    a = np.array([1.5, -2.25, 3.0], dtype=BF16)
    x = vm.array(a)
    assert x.dtype is eagervm.bfloat16 and x.numpy().dtype == BF16
    assert_same(x.numpy(), a)
    assert eagervm.bfloat16 == BF16 and hash(eagervm.bfloat16) == hash(BF16)
    assert vm.tensor(a).dtype is eagervm.bfloat16
