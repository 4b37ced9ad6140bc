"""Indexing and joining against NumPy: cat and stack (np.concatenate, np.stack),
index_select (np.take), gather (np.take_along_axis), scatter (np.put_along_axis),
scatter_add and index_add (np.add.at), embedding, advanced indexing with integer arrays,
lists and bool masks, assignment through them (index_put_), masked_select and nonzero,
over random shapes, negative dims and indices, transposed views, empty arrays and every
dtype; an index out of range fails its op with KernelError, and the VM runs on. Values
are small integers, exact in every dtype, so results compare exactly."""

import numpy as np
import pytest

import eagervm
from helpers import DTYPES, assert_same, make, np_dtype, read, values


def rng_of(seed):
    return np.random.default_rng(seed)


def rand_shape(rng, rank, lo=1, hi=4):
    return tuple(int(s) for s in rng.integers(lo, hi + 1, rank))


def arr(vm, ref, name, device, transposed=False):
    """`ref` as an array of dtype `name`; with `transposed`, a non-contiguous view holding
    the same values (the transpose of a contiguous transpose)."""
    if transposed and np.ndim(ref) >= 2:
        t = make(vm, np.ascontiguousarray(np.swapaxes(ref, -1, -2)), name, device)
        x = t.transpose(-1, -2)
        assert not x.is_contiguous() or min(np.shape(ref)[-2:]) <= 1
        return x
    return make(vm, ref, name, device)


def idx_arr(vm, ref, device, dtype=eagervm.int64):
    return vm.tensor(np.asarray(ref, dtype=np.int64), device=device).to(dtype)


# ---- cat and stack ------------------------------------------------------------------


@pytest.mark.parametrize("name", DTYPES)
def test_cat_and_stack_match_numpy(vm, device, name):
    rng = rng_of(1)
    for trial in range(12):
        rank = int(rng.integers(1, 4))
        d = int(rng.integers(-rank, rank))
        base = rand_shape(rng, rank)
        refs, arrays = [], []
        for k in range(int(rng.integers(1, 4))):
            s = list(base)
            s[d] = int(rng.integers(0, 4))
            ref = values(rng, tuple(s), name)
            refs.append(ref)
            arrays.append(arr(vm, ref, name, device, transposed=bool(k % 2)))
        out = eagervm.cat(arrays, dim=d)
        assert out.dtype is getattr(eagervm, name)
        assert_same(read(out), np.concatenate(refs, axis=d))
        same = [arr(vm, refs[0], name, device, transposed=bool(k % 2)) for k in range(3)]
        sd = int(rng.integers(-rank - 1, rank + 1))
        assert_same(read(eagervm.stack(same, sd)), np.stack([refs[0]] * 3, axis=sd))


def test_cat_promotes_and_skips_empty_vectors(vm, device):
    a = vm.tensor([[1, 2], [3, 4]], device=device)  # int64
    b = vm.tensor([[0.5, 1.5]], dtype=eagervm.float16, device=device)
    e = vm.tensor([], dtype=eagervm.float64, device=device)
    out = eagervm.cat([a, e, b])
    # PyTorch: the empty 1-D float64 array is skipped for shapes but joins the promotion.
    assert out.dtype is eagervm.float64
    assert_same(out.numpy(), [[1, 2], [3, 4], [0.5, 1.5]])
    assert eagervm.concat is eagervm.cat and eagervm.concatenate is eagervm.cat
    assert eagervm.cat([e, e]).shape == (0,)
    with pytest.raises(eagervm.InvalidOperandsError):
        eagervm.cat([a, vm.tensor([[1, 2, 3]], device=device)])
    with pytest.raises(eagervm.InvalidOperandsError):
        eagervm.stack([a, b.long().t()])
    with pytest.raises(IndexError):
        eagervm.cat([a, a], dim=2)
    with pytest.raises(TypeError):
        eagervm.cat(a)
    with pytest.raises(ValueError):
        eagervm.cat([])


def test_cat_of_more_inputs_than_one_instruction_takes(vm, device):
    parts = [vm.tensor([[i], [-i]], dtype=eagervm.int32, device=device) for i in range(600)]
    out = eagervm.cat(parts, 1)
    ref = np.array([list(range(600)), [-i for i in range(600)]], dtype=np.int32)
    assert_same(out.numpy(), ref)
    assert_same(eagervm.stack(parts, 0).numpy(), ref.T.reshape(600, 2, 1))


# ---- index_select, gather -----------------------------------------------------------


@pytest.mark.parametrize("name", DTYPES)
def test_index_select_and_gather_match_take(vm, device, name):
    rng = rng_of(2)
    for trial in range(10):
        rank = int(rng.integers(1, 4))
        shape = rand_shape(rng, rank)
        d = int(rng.integers(-rank, rank))
        ref = values(rng, shape, name)
        x = arr(vm, ref, name, device, transposed=bool(trial % 2))
        picks = rng.integers(0, shape[d], int(rng.integers(0, 6)))
        dt = eagervm.int32 if trial % 3 == 0 else eagervm.int64
        got = x.index_select(d, idx_arr(vm, picks, device, dt))
        assert_same(read(got), np.take(ref, picks, axis=d))
        assert_same(read(eagervm.index_select(x, d, idx_arr(vm, picks, device))), np.take(ref, picks, axis=d))
        ishape = list(shape)
        ishape[d] = int(rng.integers(0, 5))
        ishape = [int(rng.integers(1, s + 1)) if k != d % rank else s for k, s in enumerate(ishape)]
        gi = rng.integers(0, shape[d], ishape)
        # take_along_axis wants an index as large as the input in the other dimensions.
        sl = tuple(slice(0, s) for s in ishape)
        sl = tuple(slice(None) if k == d % rank else sl[k] for k in range(rank))
        want = np.take_along_axis(ref[sl], gi, axis=d)
        assert_same(read(x.gather(d, idx_arr(vm, gi, device, dt))), want)
        assert_same(read(eagervm.gather(x, d, idx_arr(vm, gi, device))), want)


def test_indices_out_of_range_raise_kernel_error_and_the_vm_runs_on(vm, device):
    x = vm.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], device=device)
    bad = [
        lambda: x.index_select(1, idx_arr(vm, [0, 3], device)),
        lambda: x.index_select(0, idx_arr(vm, [-1], device)),  # index_select does not wrap
        lambda: x.gather(1, idx_arr(vm, [[5]], device)),
        lambda: x.scatter(0, idx_arr(vm, [[2]], device), 1.0),
        lambda: x.scatter_add(0, idx_arr(vm, [[-1]], device), x[:1, :1]),
        lambda: x.index_add(0, idx_arr(vm, [2], device), x[:1]),
        lambda: x[idx_arr(vm, [0, 2], device)],
        lambda: x[:, [3]],
        lambda: x[[-3]],
        lambda: eagervm.nn.functional.embedding(idx_arr(vm, [0, 7], device), x),
    ]
    for f in bad:
        y = f()
        with pytest.raises(eagervm.KernelError, match="out of range for dimension"):
            y.numpy()
    with pytest.raises(eagervm.KernelError, match=r"index_select: index 3 is out of range for dimension 1 of size 3"):
        x.index_select(1, idx_arr(vm, [3], device)).numpy()
    # The VM runs on, and x is untouched.
    assert_same(x.numpy(), [[1, 2, 3], [4, 5, 6]])
    assert_same(x.index_select(-1, idx_arr(vm, [2, 0], device)).numpy(), [[3, 1], [6, 4]])
    y = x.clone()
    y[idx_arr(vm, [0, 5], device)] = 0.0
    with pytest.raises(eagervm.KernelError):
        y.numpy()
    with pytest.raises(IndexError):
        x.index_select(2, idx_arr(vm, [0], device))
    with pytest.raises(eagervm.InvalidOperandsError, match="int64"):
        x.index_select(0, vm.tensor([0.0], device=device))


# ---- scatter, scatter_add, index_add ------------------------------------------------


@pytest.mark.parametrize("name", DTYPES)
def test_scatter_and_scatter_add_match_numpy(vm, device, name):
    rng = rng_of(3)
    for trial in range(8):
        rank = int(rng.integers(1, 4))
        shape = rand_shape(rng, rank)
        d = int(rng.integers(-rank, rank))
        ref = values(rng, shape, name)
        ishape = [int(rng.integers(1, s + 1)) for s in shape]
        ishape[d] = int(rng.integers(1, 6))
        gi = rng.integers(0, shape[d], ishape)
        src_ref = values(rng, tuple(ishape), name)
        x = arr(vm, ref, name, device, transposed=bool(trial % 2))
        idx = idx_arr(vm, gi, device)
        src = make(vm, src_ref, name, device)
        # scatter: the last write in row-major order of the index wins where it repeats.
        want = ref.copy()
        want_add = ref.copy().astype(np.int64) if name != "bool" else ref.copy()
        for pos in np.ndindex(*ishape):
            t = list(pos)
            t[d] = gi[pos]
            want[tuple(t)] = src_ref[pos]
            if name == "bool":
                want_add[tuple(t)] |= src_ref[pos]
            else:
                want_add[tuple(t)] += src_ref[pos]
        assert_same(read(x.scatter(d, idx, src)), want)
        assert_same(read(eagervm.scatter(x, d, idx, src)), want)
        got = read(x.scatter_add(d, idx, src))
        if name == "uint8":
            want_add = want_add.astype(np.uint8)  # wraps, as PyTorch's uint8 does
        elif name in ("float16", "bfloat16"):
            # Sums of small integers stay exact below 256 (bfloat16's 8 bits of precision).
            assert np.abs(want_add.astype(np.float64)).max() < 256
        assert_same(got, want_add)
        assert_same(read(eagervm.scatter_add(x, d, idx, src)), want_add)
        y = x.clone()
        assert y.scatter_add_(d, idx, src) is y
        assert_same(read(y), want_add)
        # A number as the source, in place.
        z = x.clone()
        z.scatter_(d, idx, value=1)
        w = ref.copy()
        for pos in np.ndindex(*ishape):
            t = list(pos)
            t[d] = gi[pos]
            w[tuple(t)] = 1
        assert_same(read(z), w)


def test_scatter_reduce_multiply_and_errors(vm, device):
    x = vm.tensor([1.0, 2.0, 3.0], device=device)
    idx = idx_arr(vm, [0, 0, 2], device)
    src = vm.tensor([2.0, 5.0, 10.0], device=device)
    assert_same(x.scatter(0, idx, src, reduce="multiply").numpy(), [10.0, 2.0, 30.0])
    assert_same(x.scatter(0, idx, src, reduce="add").numpy(), [8.0, 2.0, 13.0])
    with pytest.raises(ValueError):
        x.scatter(0, idx, src, reduce="mean")
    with pytest.raises(eagervm.InvalidOperandsError, match="src must have the input's dtype"):
        x.scatter(0, idx, src.double())
    with pytest.raises(TypeError):
        x.scatter(0, idx)


def test_scatter_add_of_repeated_indices_is_deterministic(vm, device):
    rng = rng_of(4)
    n = 5000
    idx = rng.integers(0, 7, n)
    src = rng.standard_normal(n).astype(np.float32)
    x = vm.zeros(7, device=device)
    i, s = idx_arr(vm, idx, device), vm.tensor(src, device=device)
    first = x.scatter_add(0, i, s).numpy()
    for _ in range(3):
        np.testing.assert_array_equal(x.scatter_add(0, i, s).numpy(), first)
    # In increasing source index: a sequential float32 sum.
    want = np.zeros(7, np.float32)
    for k in range(n):
        want[idx[k]] = np.float32(want[idx[k]] + src[k])
    np.testing.assert_array_equal(first, want)


@pytest.mark.parametrize("name", ["uint8", "int32", "int64", "float16", "float32", "float64"])
def test_index_add_matches_add_at(vm, device, name):
    rng = rng_of(5)
    for trial in range(8):
        rank = int(rng.integers(1, 4))
        shape = rand_shape(rng, rank)
        d = int(rng.integers(-rank, rank))
        ref = values(rng, shape, name)
        n = int(rng.integers(0, 6))
        picks = rng.integers(0, shape[d], n)
        sshape = list(shape)
        sshape[d] = n
        src_ref = values(rng, tuple(sshape), name)
        x = arr(vm, ref, name, device, transposed=bool(trial % 2))
        want = ref.astype(np.int64)
        moved = np.moveaxis(want, d, 0)
        np.add.at(moved, picks, 2 * np.moveaxis(src_ref.astype(np.int64), d, 0))
        want = want.astype(np_dtype(name))
        got = x.index_add(d, idx_arr(vm, picks, device), make(vm, src_ref, name, device), alpha=2)
        assert_same(read(got), want)
        y = x.clone()
        y.index_add_(d, idx_arr(vm, picks, device), make(vm, src_ref, name, device), alpha=2)
        assert_same(read(y), want)
        assert_same(read(eagervm.index_add(x, d, idx_arr(vm, picks, device), make(vm, src_ref, name, device), alpha=2)), want)


def test_embedding(vm, device):
    rng = rng_of(6)
    w = rng.standard_normal((10, 4)).astype(np.float32)
    ids = rng.integers(0, 10, (3, 5))
    W = vm.tensor(w, device=device)
    F = eagervm.nn.functional
    np.testing.assert_array_equal(F.embedding(idx_arr(vm, ids, device), W).numpy(), w[ids])
    np.testing.assert_array_equal(F.embedding(idx_arr(vm, ids, device), W, padding_idx=0).numpy(), w[ids])
    np.testing.assert_array_equal(F.embedding(idx_arr(vm, ids, device).t(), W).numpy(), w[ids.T])
    with pytest.raises(eagervm.InvalidOperandsError):
        F.embedding(idx_arr(vm, ids, device), W, padding_idx=10)


# ---- advanced indexing ----------------------------------------------------------------


@pytest.mark.parametrize("name", DTYPES)
def test_integer_array_indexing_matches_numpy(vm, device, name):
    rng = rng_of(7)
    ref = values(rng, (4, 5, 3), name)
    x = make(vm, ref, name, device)
    xt = arr(vm, np.ascontiguousarray(np.swapaxes(ref, 1, 2)), name, device).transpose(1, 2)
    i = rng.integers(-4, 4, (2, 3))
    j = rng.integers(-5, 5, (3,))
    k = rng.integers(-3, 3, (2, 1))
    cases = [
        ((idx_arr(vm, i, device),), (i,)),
        (([1, -1, 0],), ([1, -1, 0],)),
        ((slice(None), idx_arr(vm, j, device)), (slice(None), j)),
        ((Ellipsis, idx_arr(vm, k, device)), (Ellipsis, k)),
        ((idx_arr(vm, i, device), idx_arr(vm, j, device)), (i, j)),
        ((idx_arr(vm, i[:, :1], device), slice(1, 4), idx_arr(vm, k, device)), (i[:, :1], slice(1, 4), k)),  # not adjacent
        ((None, slice(None), idx_arr(vm, j, device)), (None, slice(None), j)),
        (([],), (np.array([], dtype=np.int64),)),
        ((idx_arr(vm, j % 4, device, eagervm.int32), slice(None, 2)), (j % 4, slice(None, 2))),
    ]
    for key, npkey in cases:
        want = ref[npkey]
        assert_same(read(x[key]), want)
        assert_same(read(xt[key]), want)


@pytest.mark.parametrize("name", DTYPES)
def test_mask_indexing_masked_select_and_nonzero(vm, device, name):
    rng = rng_of(8)
    ref = values(rng, (3, 4, 2), name)
    x = make(vm, ref, name, device)
    m2 = rng.integers(0, 2, (3, 4)).astype(bool)
    m1 = rng.integers(0, 2, (4,)).astype(bool)
    M2 = vm.tensor(m2, device=device)
    assert_same(read(x[M2]), ref[m2])
    assert_same(read(x[:, vm.tensor(m1, device=device)]), ref[:, m1])
    assert_same(read(x[m2.tolist()]), ref[m2])
    assert_same(read(x[vm.tensor(np.zeros((3, 4), bool), device=device)]), ref[np.zeros((3, 4), bool)])
    m3 = ref.astype(np.int64) > 4
    assert_same(read(x.masked_select(vm.tensor(m3, device=device))), ref[m3])
    # The mask broadcasts in masked_select.
    assert_same(read(eagervm.masked_select(x, vm.tensor(m1[:, None], device=device))), ref[np.broadcast_to(m1[:, None], ref.shape)])
    assert_same(x.nonzero().numpy(), np.argwhere(ref))
    assert x.nonzero().dtype is eagervm.int64
    cols = eagervm.nonzero(x, as_tuple=True)
    for c, w in zip(cols, np.nonzero(ref)):
        assert_same(c.numpy(), w)
    with pytest.raises(eagervm.InvalidOperandsError, match="mask"):
        x[vm.tensor(np.ones((4, 3), bool), device=device)]


@pytest.mark.parametrize("name", DTYPES)
def test_assignment_through_index_arrays_and_masks(vm, device, name):
    rng = rng_of(9)
    ref = values(rng, (4, 3), name)
    i = np.array([2, 0, -1])
    v = values(rng, (3, 3), name)
    v12 = values(rng, (12,), name)
    cases = [
        (lambda x: x.__setitem__(idx_arr(vm, i, device), make(vm, v, name, device)), lambda r: r.__setitem__(i, v)),
        (lambda x: x.__setitem__([1, 3], 1), lambda r: r.__setitem__([1, 3], 1)),
        (lambda x: x.__setitem__((slice(None), [0, 2]), make(vm, v[:, :1].T.repeat(4, 0)[:4, :1], name, device)),
         lambda r: r.__setitem__((slice(None), [0, 2]), v[:, :1].T.repeat(4, 0)[:4, :1])),
        (lambda x: x.__setitem__(vm.tensor(ref.astype(np.int64) > 4, device=device), 0),
         lambda r: r.__setitem__(r.astype(np.int64) > 4, 0)),
        (lambda x: x.__setitem__((slice(None), vm.tensor([True, False, True], device=device)), 1),
         lambda r: r.__setitem__((slice(None), [True, False, True]), 1)),
        (lambda x: x.__setitem__(vm.tensor(ref.astype(np.int64) > 4, device=device),
                                 make(vm, v12[: int((ref.astype(np.int64) > 4).sum())], name, device)),
         lambda r: r.__setitem__(r.astype(np.int64) > 4, v12[: int((r.astype(np.int64) > 4).sum())])),
    ]
    for f, g in cases:
        x = arr(vm, ref, name, device, transposed=True)
        f(x)
        want = ref.copy()
        g(want)
        assert_same(read(x), want)


def test_index_put_accumulate_matches_add_at(vm, device):
    rng = rng_of(10)
    ref = rng.integers(0, 10, (5, 3)).astype(np.float32)
    i = rng.integers(-5, 5, 20)
    v = rng.integers(0, 10, (20, 3)).astype(np.float32)
    x = vm.tensor(ref, device=device)
    assert x.index_put_((idx_arr(vm, i, device),), vm.tensor(v, device=device), accumulate=True) is x
    want = ref.copy()
    np.add.at(want, i, v)
    assert_same(x.numpy(), want)
    y = vm.tensor(ref, device=device).index_put((None, idx_arr(vm, [0, 0, 2], device)), vm.tensor([1.0, 2.0, 3.0], device=device), True)
    want = ref.copy()
    want[:, 0] += 3.0
    want[:, 2] += 3.0
    assert_same(y.numpy(), want)


def test_empty_and_errors(vm, device):
    x = vm.zeros(0, 3, device=device)
    assert x.index_select(0, idx_arr(vm, [], device)).shape == (0, 3)
    assert x[idx_arr(vm, [], device)].shape == (0, 3)
    assert eagervm.cat([x, x], 1).shape == (0, 6)
    assert x.nonzero().shape == (0, 2)
    y = vm.tensor([1.0, 2.0], device=device)
    with pytest.raises(eagervm.InvalidOperandsError, match="int64"):
        y[vm.tensor([0.0], device=device)]
    with pytest.raises(eagervm.InvalidOperandsError):
        y[idx_arr(vm, [0], device), idx_arr(vm, [0], device)]


# ---- pad, flip, roll, repeat, tile ------------------------------------------------------


@pytest.mark.parametrize("name", DTYPES)
def test_flip_roll_repeat_tile_match_numpy(vm, device, name):
    rng = rng_of(11)
    for trial in range(6):
        rank = int(rng.integers(1, 4))
        shape = rand_shape(rng, rank, lo=0 if trial == 5 else 1)
        ref = values(rng, shape, name)
        x = arr(vm, ref, name, device, transposed=bool(trial % 2))
        dims = tuple(int(d) for d in rng.choice(rank, int(rng.integers(1, rank + 1)), replace=False))
        neg = tuple(d - rank if k % 2 else d for k, d in enumerate(dims))
        assert_same(read(x.flip(*neg)), np.flip(ref, dims))
        assert_same(read(eagervm.flip(x, neg)), np.flip(ref, dims))
        shifts = tuple(int(s) for s in rng.integers(-7, 8, len(dims)))
        assert_same(read(x.roll(shifts, neg)), np.roll(ref, shifts, dims))
        assert_same(read(eagervm.roll(x, 3)), np.roll(ref, 3))
        reps = tuple(int(r) for r in rng.integers(0, 3, rank + int(rng.integers(0, 2))))
        assert_same(read(x.repeat(*reps)), np.tile(ref, reps))
        t = reps[-rank:][:-1] if rank > 1 else reps[:1]
        assert_same(read(x.tile(t)), np.tile(ref, t))
        assert_same(read(eagervm.tile(x, t)), np.tile(ref, t))


@pytest.mark.parametrize("name", DTYPES)
def test_pad_matches_numpy(vm, device, name):
    rng = rng_of(12)
    F = eagervm.nn.functional
    for trial in range(8):
        rank = int(rng.integers(1, 4))
        shape = rand_shape(rng, rank, lo=2, hi=4)
        ref = values(rng, shape, name)
        x = arr(vm, ref, name, device, transposed=bool(trial % 2))
        k = int(rng.integers(1, rank + 1))
        pairs = [(int(rng.integers(0, 3)), int(rng.integers(0, 3))) for _ in range(k)]
        flat = [p for pair in pairs for p in pair]
        widths = [(0, 0)] * (rank - k) + pairs[::-1]
        assert_same(read(F.pad(x, flat, value=1)), np.pad(ref, widths, constant_values=1))
        assert_same(read(F.pad(x, flat, mode="replicate")), np.pad(ref, widths, mode="edge"))
        assert_same(read(F.pad(x, flat, mode="circular")), np.pad(ref, widths, mode="wrap"))
        rw = [(min(a, s - 1), min(b, s - 1)) for (a, b), s in zip(widths, ref.shape)]
        rflat = [p for pair in rw[::-1][:k] for p in pair]
        assert_same(read(F.pad(x, rflat, mode="reflect")), np.pad(ref, rw, mode="reflect"))
    # Negative pads crop.
    ref = np.arange(12).reshape(3, 4).astype(np.float32)
    x = vm.tensor(ref, device=device)
    assert_same(F.pad(x, (-1, 2, 1, -2)).numpy(), np.pad(ref[:1, 1:], ((1, 0), (0, 2))))
    with pytest.raises(eagervm.InvalidOperandsError):
        F.pad(x, (1,))
    with pytest.raises(eagervm.InvalidOperandsError):
        F.pad(x, (4, 0), mode="reflect")
    with pytest.raises(ValueError):
        F.pad(x, (1, 1), mode="reflect", value=2)
    with pytest.raises(ValueError):
        F.pad(x, (1, 1), mode="symmetric")


@pytest.mark.parametrize("name", DTYPES)
def test_index_copy_index_fill_take(vm, device, name):
    rng = rng_of(13)
    for trial in range(6):
        rank = int(rng.integers(1, 4))
        shape = rand_shape(rng, rank)
        d = int(rng.integers(-rank, rank))
        ref = values(rng, shape, name)
        x = arr(vm, ref, name, device, transposed=bool(trial % 2))
        n = int(rng.integers(0, shape[d] + 1))
        picks = rng.permutation(shape[d])[:n]
        sshape = list(shape)
        sshape[d] = n
        src = values(rng, tuple(sshape), name)
        want = ref.copy()
        sl = [slice(None)] * rank
        sl[d] = picks
        want[tuple(sl)] = src
        assert_same(read(x.index_copy(d, idx_arr(vm, picks, device), make(vm, src, name, device))), want)
        y = x.clone()
        y.index_copy_(d, idx_arr(vm, picks, device), make(vm, src, name, device))
        assert_same(read(y), want)
        assert_same(read(eagervm.index_copy(x, d, idx_arr(vm, picks, device), make(vm, src, name, device))), want)
        fill = rng.integers(-shape[d], shape[d], 3)
        want = ref.copy()
        sl[d] = fill
        want[tuple(sl)] = 1
        assert_same(read(x.index_fill(d, idx_arr(vm, fill, device), 1)), want)
        assert_same(read(eagervm.index_fill(x, d, idx_arr(vm, fill, device), 1)), want)
        flat = rng.integers(-ref.size, ref.size, (2, 3))
        assert_same(read(x.take(idx_arr(vm, flat, device))), np.take(ref, flat))
        assert_same(read(eagervm.take(x, idx_arr(vm, flat, device))), np.take(ref, flat))
    x = vm.tensor([[1.0, 2.0], [3.0, 4.0]], device=device)
    with pytest.raises(eagervm.KernelError, match="out of range"):
        x.index_copy(0, idx_arr(vm, [-1], device), x[:1]).numpy()
    with pytest.raises(eagervm.InvalidOperandsError):
        x.index_copy(0, idx_arr(vm, [0], device), x)
