"""Every view op against NumPy's: the same values and shape, the strides and offset NumPy
gives the same view of a C-contiguous array, and the result shares the storage (a write
through the view changes the base), over random shapes (0-d and empty among them) and
every dtype."""

import numpy as np
import pytest

import eagervm
from helpers import DTYPES, make, np_dtype, read, values


def layout_of(view, base):
    """NumPy's (shape, strides, offset) of `view`, a view of `base`, in elements."""
    item = base.itemsize
    offset = (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // item
    return view.shape, tuple(s // item for s in view.strides), offset


def writable_view(view, base):
    """A writable NumPy array over `base`'s memory with `view`'s layout (`np.diagonal`
    gives a read-only one)."""
    if view.size == 0:
        return view
    offset = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return np.ndarray(view.shape, base.dtype, buffer=base, offset=offset, strides=view.strides)


def take(ref, i, d):
    """`ref[..., i, ...]` at dimension `d`: a view (`np.take` copies)."""
    idx = [slice(None)] * ref.ndim
    idx[d] = i
    return ref[tuple(idx) + (Ellipsis,)]


def fill_value(name):
    return True if name == "bool" else 7


def check_view(x, base, v, ref_view, ref_base, name, writable=True):
    """`v` (an eagervm view of `x`) matches `ref_view` (NumPy's of `ref_base`): values,
    shape, strides and offset; and writing through it writes `x`."""
    assert v.shape == ref_view.shape
    np.testing.assert_array_equal(read(v), ref_view)
    if ref_view.size > 0 and ref_view.base is not None:
        shape, strides, offset = layout_of(ref_view, ref_base)
        # Strides of dimensions of size 1 take no part in a layout.
        got = tuple(s for s, d in zip(v.stride(), shape) if d > 1)
        assert got == tuple(s for s, d in zip(strides, shape) if d > 1), (v.stride(), strides)
        assert v.storage_offset() == offset
    if not writable or ref_view.size == 0:
        return
    val = fill_value(name)
    v.fill_(val)
    assert ref_view.base is not None or ref_view is ref_base, "the reference must be a view"
    writable_view(ref_view, ref_base)[...] = val
    np.testing.assert_array_equal(read(x), ref_base)


def random_shape(rng, max_rank=4, max_size=4, allow_empty=True):
    rank = int(rng.integers(0, max_rank + 1))
    low = 0 if allow_empty and rng.random() < 0.15 else 1
    return tuple(int(rng.integers(low, max_size + 1)) for _ in range(rank))


CASES = 12


@pytest.fixture(params=DTYPES)
def name(request):
    return request.param


def cases(seed, **kw):
    rng = np.random.default_rng(seed)
    for _ in range(CASES):
        yield rng, random_shape(rng, **kw)


def test_transpose_permute_t_T_mT(vm, device, name):
    for rng, shape in cases(1):
        ref = values(rng, shape, name)
        x = make(vm, ref, name, device)
        n = len(shape)
        if n >= 1:
            d0, d1 = (int(d) for d in rng.integers(-n, n, 2))
            check_view(x, ref, x.transpose(d0, d1), np.swapaxes(ref, d0, d1), ref, name)
            perm = [int(p) for p in rng.permutation(n)]
            check_view(x, ref, x.permute(*perm), np.transpose(ref, perm), ref, name)
            check_view(x, ref, x.permute(perm), np.transpose(ref, perm), ref, name)
        check_view(x, ref, x.T, np.transpose(ref), ref, name)
        if n <= 2:
            check_view(x, ref, x.t(), ref.T, ref, name)
        else:
            with pytest.raises(ValueError, match="at most 2 dimensions"):
                x.t()
        if n >= 2:
            check_view(x, ref, x.mT, np.swapaxes(ref, -2, -1), ref, name)


def test_view_reshape_flatten_unflatten(vm, device, name):
    for rng, shape in cases(2, allow_empty=False):
        ref = values(rng, shape, name)
        x = make(vm, ref, name, device)
        numel = ref.size
        # A random factorisation of numel, with one -1.
        dims, left = [], numel
        for _ in range(int(rng.integers(0, 3))):
            f = int(rng.choice([d for d in range(1, left + 1) if left % d == 0]))
            dims.append(f)
            left //= f
        dims.append(left)
        want = ref.reshape(dims)
        check_view(x, ref, x.view(*dims), want, ref, name)
        check_view(x, ref, x.view(tuple(dims)), want, ref, name)
        k = int(rng.integers(0, len(dims)))
        with_infer = dims[:k] + [-1] + dims[k + 1 :]
        check_view(x, ref, x.reshape(with_infer), want, ref, name)
        check_view(x, ref, x.flatten(), ref.reshape(-1), ref, name)
        if len(shape) >= 2:
            check_view(x, ref, x.flatten(1), ref.reshape(shape[0], -1), ref, name)
            check_view(x, ref, x.flatten(0, -2), ref.reshape(-1, shape[-1]), ref, name)
        if len(shape) >= 1:
            check_view(x, ref, x.unflatten(0, (1, shape[0], 1)), ref.reshape((1, shape[0], 1) + shape[1:]), ref, name)


def test_reshape_of_a_transpose_copies_where_view_refuses(vm, name):
    rng = np.random.default_rng(3)
    ref = values(rng, (3, 4), name)
    x = make(vm, ref, name)
    t = x.t()
    with pytest.raises(ValueError, match=r"view.*not compatible.*reshape") as e:
        t.view(12)
    assert isinstance(e.value, eagervm.InvalidOperandsError)
    r = t.reshape(12)
    np.testing.assert_array_equal(read(r), ref.T.reshape(12))
    r.fill_(fill_value(name))
    np.testing.assert_array_equal(read(x), ref)  # a copy: x is untouched
    f = t.flatten()
    np.testing.assert_array_equal(read(f), ref.T.reshape(-1))
    # A transpose's dimensions can still be split without a copy.
    check_view(x, ref, t.view(2, 2, 3), ref.T.reshape(2, 2, 3), ref, name)


def test_expand_and_broadcast_to(vm, device, name):
    for rng, shape in cases(4, max_rank=3):
        ref = values(rng, shape, name)
        x = make(vm, ref, name, device)
        target = tuple(int(rng.integers(2, 4)) if d == 1 else d for d in shape)
        lead = tuple(int(rng.integers(0, 3)) for _ in range(int(rng.integers(0, 3))))
        want = np.broadcast_to(ref, lead + target)
        e = x.expand(*(lead + target))
        check_view(x, ref, e, want, ref, name, writable=False)
        assert all(s == 0 for s, d, o in zip(e.stride()[len(lead) :], target, shape) if d != o)
        check_view(x, ref, x.broadcast_to(lead + target), want, ref, name, writable=False)
        keep = lead + tuple(-1 for _ in shape)
        check_view(x, ref, x.expand(keep), np.broadcast_to(ref, lead + shape), ref, name, writable=False)
        check_view(x, ref, x.expand_as(make(vm, np.broadcast_to(ref, lead + target).copy(), name, device)), want, ref, name, writable=False)


def test_writing_an_expanded_view_is_refused(vm):
    x = vm.zeros(3, 1)
    e = x.expand(3, 4)
    with pytest.raises(eagervm.OverlapError) as err:
        e.fill_(1.0)
    assert isinstance(err.value, ValueError)
    with pytest.raises(ValueError, match="expand"):
        x.expand(2, 4)


def test_squeeze_and_unsqueeze(vm, device, name):
    for rng, shape in cases(5):
        shape = tuple(1 if rng.random() < 0.4 else d for d in shape)
        ref = values(rng, shape, name)
        x = make(vm, ref, name, device)
        check_view(x, ref, x.squeeze(), np.squeeze(ref), ref, name)
        n = len(shape)
        if n:
            d = int(rng.integers(-n, n))
            want = np.squeeze(ref, d) if shape[d] == 1 else ref
            check_view(x, ref, x.squeeze(d), want, ref, name)
            ds = sorted({int(v) % n for v in rng.integers(0, n, 2)})
            want = np.squeeze(ref, tuple(i for i in ds if shape[i] == 1))
            check_view(x, ref, x.squeeze(tuple(ds)), want, ref, name)
        d = int(rng.integers(-n - 1, n + 1))
        check_view(x, ref, x.unsqueeze(d), np.expand_dims(ref, d), ref, name)


def test_narrow_select_and_diagonal(vm, device, name):
    for rng, shape in cases(6, allow_empty=False):
        ref = values(rng, shape, name)
        x = make(vm, ref, name, device)
        n = len(shape)
        if n == 0:
            with pytest.raises(IndexError):
                x.select(0, 0)
            continue
        d = int(rng.integers(-n, n))
        size = shape[d]
        start = int(rng.integers(0, size))
        length = int(rng.integers(0, size - start + 1))
        idx = [slice(None)] * n
        idx[d] = slice(start, start + length)
        check_view(x, ref, x.narrow(d, start, length), ref[tuple(idx)], ref, name)
        i = int(rng.integers(-size, size))
        check_view(x, ref, x.select(d, i), take(ref, i, d), ref, name)
        if n >= 2:
            d1, d2 = (int(v) for v in rng.choice(n, 2, replace=False))
            off = int(rng.integers(-3, 4))
            check_view(x, ref, x.diagonal(off, d1, d2), np.diagonal(ref, off, d1, d2), ref, name)
            check_view(x, ref, x.diagonal(), np.diagonal(ref), ref, name)


def test_split_chunk_and_unbind(vm, device, name):
    for rng, shape in cases(7, max_rank=3):
        ref = values(rng, shape, name)
        x = make(vm, ref, name, device)
        n = len(shape)
        if n == 0:
            for f in (lambda: x.split(1), lambda: x.chunk(2), lambda: x.unbind()):
                with pytest.raises(IndexError):
                    f()
            continue
        d = int(rng.integers(-n, n))
        size = shape[d]
        step = int(rng.integers(1, 4))
        parts = x.split(step, d)
        assert isinstance(parts, tuple)
        bounds = list(range(0, size, step))[1:] if size else []
        want = np.split(ref, bounds, axis=d) if size else [ref]
        assert len(parts) == len(want)
        for p, w in zip(parts, want):
            check_view(x, ref, p, w, ref, name)
        if size:
            cut = sorted(int(v) for v in rng.integers(0, size + 1, 2))
            sizes = [cut[0], cut[1] - cut[0], size - cut[1]]
            for p, w in zip(x.split(sizes, d), np.split(ref, [cut[0], cut[1]], axis=d)):
                check_view(x, ref, p, w, ref, name)
            k = int(rng.integers(1, 5))
            per = -(-size // k)
            chunks = x.chunk(k, d)
            want = np.split(ref, list(range(per, size, per)), axis=d)
            assert len(chunks) == len(want)
            for p, w in zip(chunks, want):
                check_view(x, ref, p, w, ref, name)
        rows = x.unbind(d)
        assert len(rows) == size
        for i, r in enumerate(rows):
            check_view(x, ref, r, take(ref, i, d), ref, name)


def test_as_strided(vm, name):
    rng = np.random.default_rng(8)
    ref = values(rng, (4, 5), name)
    x = make(vm, ref, name)
    item = ref.itemsize
    want = np.lib.stride_tricks.as_strided(ref[0, 1:], shape=(3, 2), strides=(5 * item, 2 * item))
    v = x.as_strided((3, 2), (5, 2), 1)
    np.testing.assert_array_equal(read(v), want)
    assert v.stride() == (5, 2) and v.storage_offset() == 1
    v.fill_(fill_value(name))
    for i in range(3):
        for j in range(2):
            ref.reshape(-1)[1 + 5 * i + 2 * j] = fill_value(name)
    np.testing.assert_array_equal(read(x), ref)
    with pytest.raises(ValueError, match="as_strided"):
        x.as_strided((4, 5), (5, 1), 1)  # one element past the storage


def test_views_of_views_and_contiguity(vm, device, name):
    rng = np.random.default_rng(9)
    ref = values(rng, (4, 6, 5), name)
    x = make(vm, ref, name, device)
    v = x.transpose(0, 2)[1:, ::2].select(1, -1).unsqueeze(0)
    want = np.expand_dims(np.swapaxes(ref, 0, 2)[1:, ::2][:, -1], 0)
    check_view(x, ref, v, want, ref, name)
    assert not v.is_contiguous()
    c = v.contiguous()
    assert c.is_contiguous() and c.stride() == tuple(s // want.itemsize for s in np.ascontiguousarray(want).strides)
    np.testing.assert_array_equal(read(c), want)
    assert x.contiguous() is x
    k = v.clone()
    assert k.is_contiguous()
    k.fill_(fill_value(name))
    np.testing.assert_array_equal(read(v), want)  # a clone shares nothing


def test_dimensions_out_of_range_are_index_errors(vm):
    x = vm.zeros(2, 3)
    calls = [
        lambda: x.transpose(0, 2),
        lambda: x.permute(0, 2),
        lambda: x.squeeze(2),
        lambda: x.unsqueeze(3),
        lambda: x.flatten(0, 2),
        lambda: x.narrow(-3, 0, 1),
        lambda: x.select(2, 0),
        lambda: x.select(0, 2),
        lambda: x.select(1, -4),
        lambda: x.split(1, 2),
        lambda: x.chunk(2, 5),
        lambda: x.unbind(2),
        lambda: x.diagonal(0, 0, 2),
        lambda: x.size(2),
        lambda: x.stride(-3),
    ]
    for f in calls:
        with pytest.raises(IndexError, match="out of range") as e:
            f()
        assert isinstance(e.value, eagervm.OutOfRangeError) and isinstance(e.value, eagervm.Error)
    with pytest.raises(ValueError, match="repeats"):
        x.permute(0, 0)
    with pytest.raises(ValueError, match="narrow"):
        x.narrow(1, 2, 2)
    with pytest.raises(ValueError, match="view"):
        x.view(4, -1)
    with pytest.raises(TypeError, match="view\\(dtype\\)"):
        x.view(eagervm.int32)


def test_metadata_of_views(vm):
    x = vm.zeros(4, 6, dtype=eagervm.float64)
    v = x[1:, 2::3]
    assert v.shape == (3, 2) and v.size() == (3, 2) and v.size(0) == 3 and v.size(-1) == 2
    assert v.stride() == (6, 3) and v.stride(1) == 3 and v.storage_offset() == 8
    assert v.dim() == 2 and v.ndim == 2 and v.numel() == 6 and len(v) == 3
    assert v.element_size() == 8 and v.itemsize == 8 and v.nbytes == 48
    assert not v.is_contiguous() and x.is_contiguous()
    s = vm.zeros(())
    assert s.shape == () and s.dim() == 0 and s.numel() == 1 and s.stride() == ()
    with pytest.raises(TypeError, match="len\\(\\) of a 0-d"):
        len(s)
    with pytest.raises(TypeError, match="iteration over a 0-d"):
        iter(s)
    assert [r.tolist() for r in vm.tensor([[1, 2], [3, 4]])] == [[1, 2], [3, 4]]


@pytest.mark.parametrize("perm", [(1, 0, 2), (2, 0, 1), (2, 1, 0)])
def test_a_pointwise_output_is_laid_out_like_its_input(vm, device, perm):
    """PyTorch's rule: `x.permute(p).exp()` has the strides of the dense tensor in the same
    memory order (`torch.empty_like` of the view), and equal values; `+` with a row-major
    second operand follows the first; a row-major first operand gives a row-major output."""
    rng = np.random.default_rng(11)
    ref = rng.standard_normal((2, 3, 4)).astype(np.float32)
    x = vm.array(ref, device).permute(*perm)
    want = np.exp(ref.transpose(perm))
    y = x.exp()
    # The dense strides of the same order: NumPy's copy in "K" order keeps the view's order.
    order = np.empty_like(ref.transpose(perm), order="K")
    assert y.stride() == tuple(s // 4 for s in order.strides)
    assert not y.is_contiguous()
    np.testing.assert_allclose(read(y), want, rtol=2e-7)
    c = vm.array(np.ascontiguousarray(ref.transpose(perm)), device)
    assert (x + c).stride() == y.stride()
    assert (c + x).is_contiguous()
    np.testing.assert_array_equal(read(x + c), read(c + x))
    # A view of it follows PyTorch's refusals; reshape copies; contiguous() is row-major.
    with pytest.raises(ValueError):
        y.view(24)
    np.testing.assert_allclose(read(y.reshape(24)), want.reshape(24), rtol=2e-7)
    assert y.contiguous().is_contiguous()
