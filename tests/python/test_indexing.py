"""`x[key]` and `x[key] = value` against NumPy's basic indexing: random keys of integers
(negative ones among them), slices with random bounds (out of range ones among them) and
steps, `None` and `...`, over random shapes and every dtype; the result is a view, and
assignment writes the base, broadcasting and converting the value."""

import numpy as np
import pytest

import eagervm
from helpers import DTYPES, make, np_dtype, read, values


def one_index(rng, size, empty):
    """A random index of a dimension of `size`: an integer in range, or a slice (only a
    slice for an `empty` array: see `test_an_integer_index_of_an_empty_array`)."""
    r = rng.random()
    if r < 0.3 and size > 0 and not empty:
        return int(rng.integers(-size, size))
    if r < 0.45:
        return slice(None)
    lo = int(rng.integers(-size - 2, size + 3))
    hi = int(rng.integers(-size - 2, size + 3))
    step = int(rng.integers(1, 4))
    return slice(lo if rng.random() < 0.8 else None, hi if rng.random() < 0.8 else None, step)


def random_key(rng, shape):
    """A random basic index of an array of `shape` (every integer in range): indices of
    the first dimensions, then with `...` some of the last, `None`s among them."""
    n = len(shape)
    head = int(rng.integers(0, n + 1))
    ellipsis = rng.random() < 0.3
    tail = int(rng.integers(0, n - head + 1)) if ellipsis else 0
    empty = 0 in shape
    parts = [one_index(rng, shape[d], empty) for d in range(head)]
    if ellipsis:
        parts.append(Ellipsis)
    parts += [one_index(rng, shape[d], empty) for d in range(n - tail, n)]
    for _ in range(int(rng.integers(0, 3)) if rng.random() < 0.3 else 0):
        parts.insert(int(rng.integers(0, len(parts) + 1)), None)
    if len(parts) == 1 and rng.random() < 0.5:
        return parts[0]
    return tuple(parts)


def np_view(ref, key):
    """`ref[key]` as a NumPy view (an all-integer key gives NumPy a scalar otherwise)."""
    v = ref[key]
    if isinstance(v, np.ndarray):
        return v
    return ref[(key if isinstance(key, tuple) else (key,)) + (Ellipsis,)]


def random_shape(rng):
    rank = int(rng.integers(0, 4))
    return tuple(int(rng.integers(0 if rng.random() < 0.1 else 1, 5)) for _ in range(rank))


@pytest.mark.parametrize("name", DTYPES)
def test_getitem_matches_numpy_and_is_a_view(vm, device, name):
    rng = np.random.default_rng(11)
    for _ in range(40):
        shape = random_shape(rng)
        ref = values(rng, shape, name)
        x = make(vm, ref, name, device)
        key = random_key(rng, shape)
        want = ref[key]
        got = x[key]
        assert got.shape == want.shape, (shape, key)
        np.testing.assert_array_equal(read(got), want, err_msg=f"{shape} {key}")
        if want.size:
            val = True if name == "bool" else 9
            got.fill_(val)
            np_view(ref, key)[...] = val
            np.testing.assert_array_equal(read(x), ref, err_msg=f"{shape} {key}")


def cast_like(value, dtype):
    """`value` converted as eagervm converts it to `dtype` (floats truncate toward zero)."""
    return np.asarray(value).astype(dtype)


@pytest.mark.parametrize("name", DTYPES)
def test_setitem_broadcasts_and_converts(vm, device, name):
    rng = np.random.default_rng(12)
    for _ in range(30):
        shape = random_shape(rng)
        ref = values(rng, shape, name)
        x = make(vm, ref, name, device)
        key = random_key(rng, shape)
        target = np_view(ref, key)
        kind = rng.random()
        if kind < 0.3:
            value = True if name == "bool" else int(rng.integers(0, 10))
            target[...] = value
        elif kind < 0.5:
            value = 2.75
            target[...] = cast_like(value, ref.dtype)
        else:
            # An array of another dtype, broadcast: a suffix of the target's shape, some
            # dimensions 1.
            k = int(rng.integers(0, target.ndim + 1))
            vshape = tuple(1 if rng.random() < 0.3 else d for d in target.shape[target.ndim - k :])
            other = str(rng.choice(DTYPES))
            vref = values(rng, vshape, other)
            value = make(vm, vref, other, device)
            target[...] = cast_like(vref.astype(np.float64) if other == "bfloat16" else vref, ref.dtype)
        x[key] = value
        np.testing.assert_array_equal(read(x), ref, err_msg=f"{shape} {key}")


def test_an_integer_index_of_an_empty_array(vm):
    x = vm.zeros(2, 0)
    assert x[1].shape == (0,)
    assert x.narrow(0, 1, 1).shape == (1, 0)


def test_setitem_takes_lists_and_numpy_values(vm):
    x = vm.zeros(3, 4, dtype=eagervm.int64)
    x[1] = [1, 2, 3, 4]
    x[:, 0] = np.array([7, 8, 9])
    x[2, 1:] = 5.9  # truncated toward zero, as PyTorch converts
    assert x.tolist() == [[7, 0, 0, 0], [8, 2, 3, 4], [9, 5, 5, 5]]
    y = x[0:2]
    y += 10  # in place through the view: x changes
    assert x.tolist() == [[17, 10, 10, 10], [18, 12, 13, 14], [9, 5, 5, 5]]
    x[1:, ::2] *= 2
    assert x.tolist() == [[17, 10, 10, 10], [36, 12, 26, 14], [18, 5, 10, 5]]


def test_indexing_errors_are_pytorch_s(vm):
    x = vm.zeros(3, 4)
    for key in [3, -4, (0, 4), (Ellipsis, -5), (None, 3)]:
        with pytest.raises(IndexError, match="out of range") as e:
            x[key]
        assert isinstance(e.value, eagervm.OutOfRangeError)
    with pytest.raises(IndexError, match="too many indices"):
        x[0, 0, 0]
    with pytest.raises(IndexError, match="single ellipsis"):
        x[..., 0, ...]
    with pytest.raises(ValueError, match="step must be positive") as e:
        x[::-1]
    assert isinstance(e.value, eagervm.Error)
    with pytest.raises(ValueError, match="step must be positive"):
        x[:, ::0]
    for key in [True, 1.5, "a", (0, 1.5)]:
        with pytest.raises(IndexError, match="not supported|indexes with"):
            x[key]
    with pytest.raises(IndexError, match="out of range"):
        x[5] = 1.0
    with pytest.raises(ValueError, match="broadcast|expand"):
        x[0] = vm.zeros(3)
    # A float value into an int array converts; an array that cannot broadcast does not.
    i = vm.zeros(2, dtype=eagervm.int32)
    i[0] = 1.5
    assert i.tolist() == [1, 0]


def test_indices_of_every_integer_kind(vm):
    x = vm.tensor([[1, 2, 3], [4, 5, 6]])
    assert x[np.int64(1), np.int32(-1)].item() == 6
    assert x[1:2**70].shape == (1, 3)
    assert x[-(2**70) : 1].shape == (1, 3)
    assert x[np.int64(0) : np.int64(1)].tolist() == [[1, 2, 3]]


def test_a_view_of_a_release_and_its_owner(vm):
    x = vm.tensor([1.0, 2.0, 3.0])
    v = x[1:]
    x.release()
    # The storage stays for the view (`Array.release` of an owner with live views).
    assert v.tolist() == [2.0, 3.0]
    with pytest.raises(eagervm.ReleasedError):
        x + 1
    assert np_dtype("float32") == np.float32
