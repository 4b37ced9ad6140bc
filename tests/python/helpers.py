"""What the value tests share: every dtype by name, arrays made from NumPy references, and
reads that work for every dtype with or without ml_dtypes."""

import numpy as np

import eagervm

DTYPES = ["bool", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # optional: bfloat16 is then checked through float32
    ml_dtypes = None
    BF16 = None


def np_dtype(name):
    """NumPy's dtype for eagervm's `name`; float32 stands for bfloat16 without ml_dtypes."""
    if name == "bfloat16":
        return BF16 if BF16 is not None else np.dtype(np.float32)
    return np.dtype(name)


def values(rng, shape, name):
    """Random small integers (exact in every dtype) as a NumPy reference of dtype `name`."""
    if name == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(0, 10, shape).astype(np_dtype(name))


def make(vm, ref, name, device="cpu:0"):
    """An eagervm array of dtype `name` holding `ref`."""
    x = vm.array(np.array(ref, order="C"), device)
    if x.dtype != getattr(eagervm, name):
        x = x.to(getattr(eagervm, name))
    assert x.dtype is getattr(eagervm, name)
    return x


def read(x):
    """`x`'s values as NumPy, for every dtype (bfloat16 through float32 without ml_dtypes)."""
    if x.dtype == eagervm.bfloat16 and BF16 is None:
        return x.float().numpy()
    return x.numpy()


def round_bf16(a):
    """float32 values rounded to bfloat16 (to nearest even), as float32."""
    u = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    out = r.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(a), a, out)


def assert_same(actual, desired, **kw):
    """`np.testing.assert_array_equal`, with floats compared as float64 (NumPy knows NaN
    there; it does not in ml_dtypes' bfloat16)."""
    actual, desired = np.asarray(actual), np.asarray(desired)
    if actual.dtype.kind not in "biu" or desired.dtype.kind not in "biu":
        actual, desired = actual.astype(np.float64), desired.astype(np.float64)
    np.testing.assert_array_equal(actual, desired, **kw)
