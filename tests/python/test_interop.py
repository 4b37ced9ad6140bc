"""DLPack round trips, threads and the GIL, KeyboardInterrupt during a wait."""

import ctypes
import gc
import os
import signal
import sys
import threading
import time
import weakref

import numpy as np
import pytest

import eagervm


def capsule_name(cap):
    """The name of a PyCapsule (a DLPack capsule: "dltensor" or "dltensor_versioned")."""
    get = ctypes.pythonapi.PyCapsule_GetName
    get.restype, get.argtypes = ctypes.c_char_p, [ctypes.py_object]
    return get(cap).decode()


def in_place(vm, op, inputs, out, scalar=None):
    """Write ``out`` in place with ``op`` (an instruction the VM runs later)."""
    stream = vm.stream(out.device, "compute")
    with vm.program() as p:
        p.call_into(op, inputs, [out], stream=stream, scalar=scalar)


def test_dlpack_numpy_round_trip(vm, device):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = eagervm.from_dlpack(a, vm=vm, device=device)
    assert x.device == device
    y = x * 2.0
    assert y.__dlpack_device__() == (1, 0)
    back = np.from_dlpack(y)
    np.testing.assert_array_equal(back, a * 2)
    k = vm.from_dlpack(np.arange(5, dtype=np.int64))
    np.testing.assert_array_equal(np.from_dlpack(k), np.arange(5))


def test_from_dlpack_without_a_vm_uses_the_default_one():
    a = np.arange(3, dtype=np.float32)
    x = eagervm.from_dlpack(a)
    assert eagervm.default_vm() is eagervm.default_vm()
    a[2] = 7.0
    np.testing.assert_array_equal(x.numpy(), [0, 1, 7])


def test_import_shares_the_producer_s_memory(vm):
    a = np.arange(8, dtype=np.float32)
    x = vm.from_dlpack(a)
    a[0] = 100.0  # written through NumPy: the VM's array is that memory
    np.testing.assert_array_equal((x * 1.0).numpy(), [100, 1, 2, 3, 4, 5, 6, 7])
    # The VM writes it in place too; NumPy sees it once the write is waited for.
    in_place(vm, "scale", [x * 1.0], x, scalar=-1.0)
    x.wait()
    np.testing.assert_array_equal(a, -np.array([100, 1, 2, 3, 4, 5, 6, 7], np.float32))
    # copy=True makes its own memory.
    c = vm.from_dlpack(a, copy=True)
    a[1] = 5.0
    assert c.numpy()[1] == -1.0


def test_export_is_a_view_of_the_vm_s_storage(vm):
    y = vm.array(np.ones(6, np.float32)) * 3.0
    v = np.from_dlpack(y)  # waits for the write of y, then views its storage
    np.testing.assert_array_equal(v, [3.0] * 6)
    in_place(vm, "fill", [], y, scalar=7.0)
    y.wait()
    np.testing.assert_array_equal(v, [7.0] * 6)
    # copy=True is a snapshot.
    snap = np.from_dlpack(y, copy=True)
    in_place(vm, "fill", [], y, scalar=1.0)
    y.wait()
    np.testing.assert_array_equal(snap, [7.0] * 6)
    np.testing.assert_array_equal(v, [1.0] * 6)
    # numpy.asarray(..., copy=False) is the same view.
    w = np.asarray(y, copy=False)
    w[0] = 9.0
    assert y.numpy()[0] == 9.0


def test_an_export_outlives_the_array_and_the_vm():
    vm = eagervm.VM()
    y = vm.array(np.arange(1000, dtype=np.float32)) * 2.0
    v = np.from_dlpack(y)
    del y
    vm.sync()  # y's release has run
    # The VM's allocator hands a freed block of this size to the next array that asks; the
    # exported one must not be among them.
    zs = [vm.full([1000], -1.0) for _ in range(8)]
    vm.sync()
    np.testing.assert_array_equal(v, np.arange(1000, dtype=np.float32) * 2)
    del zs, vm
    gc.collect()
    np.testing.assert_array_equal(v, np.arange(1000, dtype=np.float32) * 2)


def test_device_arrays_export_a_host_copy(vm):
    x = vm.array(np.arange(4, dtype=np.float32), "mock:0")
    cap = x.__dlpack__(max_version=(1, 0))
    assert capsule_name(cap) == "dltensor_versioned"
    np.testing.assert_array_equal(np.from_dlpack(x), [0, 1, 2, 3])
    with pytest.raises(BufferError, match="copy=False"):
        x.__dlpack__(copy=False)
    with pytest.raises(ValueError, match="host memory"):
        np.asarray(x, copy=False)


def test_capsule_kinds_and_an_unconsumed_capsule(vm):
    x = vm.array(np.arange(3, dtype=np.int64))
    assert capsule_name(x.__dlpack__()) == "dltensor"
    assert capsule_name(x.__dlpack__(max_version=(0, 8))) == "dltensor"
    assert capsule_name(x.__dlpack__(max_version=(1, 3))) == "dltensor_versioned"
    # Dropped without a consumer: its destructor deletes the export (no leak, no crash).
    for _ in range(100):
        x.__dlpack__(max_version=(1, 0))
    gc.collect()
    np.testing.assert_array_equal(x.numpy(), [0, 1, 2])


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_every_vm_dtype_both_ways(vm, dtype):
    a = np.arange(-3, 3, dtype=dtype).reshape(2, 3)
    x = vm.from_dlpack(a)
    assert x.dtype == dtype and x.shape == (2, 3)
    back = np.from_dlpack(x)
    assert back.dtype == dtype
    np.testing.assert_array_equal(back, a)
    a[0, 0] = 42
    assert back[0, 0] == 42, "both views are the producer's memory"


@pytest.mark.parametrize("dtype", [np.int16, np.uint32, np.complex64])
def test_other_dtypes_are_refused(vm, dtype):
    with pytest.raises(TypeError, match="no dtype for the DLPack dtype"):
        vm.from_dlpack(np.zeros(3, dtype=dtype))


def test_strided_and_offset_producers(vm):
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    strided = base[:, 1:5:2]
    x = vm.from_dlpack(strided)  # not contiguous: one copy
    np.testing.assert_array_equal(x.numpy(), strided)
    base[0, 1] = -1.0
    assert x.numpy()[0, 0] == 1.0, "a copy"
    with pytest.raises(BufferError, match="not contiguous"):
        vm.from_dlpack(strided, copy=False)
    np.testing.assert_array_equal(vm.from_dlpack(base.T).numpy(), base.T)
    np.testing.assert_array_equal(vm.from_dlpack(base[::-1]).numpy(), base[::-1])
    # An offset of one float32 leaves the data 4-byte aligned: copied.
    f = np.arange(9, dtype=np.float32)[1:]
    y = vm.from_dlpack(f)
    np.testing.assert_array_equal(y.numpy(), np.arange(1, 9))
    with pytest.raises(BufferError, match="aligned"):
        vm.from_dlpack(f, copy=False)
    # An offset of one int64 keeps 8-byte alignment: shared, at the offset.
    i = np.arange(9, dtype=np.int64)
    z = vm.from_dlpack(i[1:], copy=False)
    i[1] = 77
    np.testing.assert_array_equal(z.numpy(), [77, 2, 3, 4, 5, 6, 7, 8])
    # A sliced row block is contiguous: shared.
    rows = vm.from_dlpack(base[2:], copy=False)
    base[2, 0] = 0.5
    assert rows.numpy()[0, 0] == 0.5


def test_read_only_producers_are_copied(vm):
    a = np.arange(4, dtype=np.float32)
    a.setflags(write=False)
    x = vm.from_dlpack(a)
    np.testing.assert_array_equal(x.numpy(), a)
    with pytest.raises(BufferError, match="read-only"):
        vm.from_dlpack(a, copy=False)


def test_zero_size_arrays(vm, device):
    for shape in [(0,), (0, 3), (2, 0, 4)]:
        a = np.zeros(shape, np.float32)
        x = vm.from_dlpack(a, device=device)
        assert x.shape == shape
        back = np.from_dlpack(x)
        assert back.shape == shape and back.dtype == np.float32
        assert (x.relu()).numpy().shape == shape


def test_a_scalar_array_both_ways(vm):
    x = vm.from_dlpack(np.array(2.5, dtype=np.float32))
    assert x.shape == ()
    assert float(np.from_dlpack(x * 2.0)) == 5.0


def test_the_producer_s_deleter_runs_once_when_the_vm_frees_it(vm):
    a = np.arange(1000, dtype=np.float32)
    before = sys.getrefcount(a)
    x = vm.from_dlpack(a)
    y = x * 2.0
    assert sys.getrefcount(a) == before + 1, "the VM's storage holds the producer"
    del x
    vm.sync()  # the release has run, and the deleter with it
    assert sys.getrefcount(a) == before
    np.testing.assert_array_equal(y.numpy(), a * 2)
    # The producer dropped first: its memory lives on until the VM frees it.
    b = np.full(10, 3.0, dtype=np.float32)
    r = weakref.ref(b)
    z = vm.from_dlpack(b)
    del b
    gc.collect()
    assert r() is not None
    np.testing.assert_array_equal(z.numpy(), [3.0] * 10)
    del z
    vm.sync()
    gc.collect()
    assert r() is None, "the deleter did not run"
    # A copied import gives the producer back at once.
    c = np.arange(10, dtype=np.float32)[::2]
    base = c.base
    before = sys.getrefcount(base)
    vm.from_dlpack(c)
    assert sys.getrefcount(base) == before


def test_an_import_to_a_device_is_one_copy(vm):
    a = np.arange(6, dtype=np.float32)
    x = vm.from_dlpack(a, device="mock:1")
    assert x.device == "mock:1"
    a[0] = 50.0
    assert x.numpy()[0] == 0.0
    with pytest.raises(BufferError, match="copy=False"):
        vm.from_dlpack(a, device="mock:1", copy=False)


def test_dlpack_refuses_what_it_cannot_do(vm):
    x = vm.array(np.ones(2, np.float32))
    with pytest.raises(BufferError, match="host memory"):
        x.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError, match="stream"):
        x.__dlpack__(stream=1)
    with pytest.raises(TypeError, match="DLPack producer"):
        vm.from_dlpack(object())
    with pytest.raises(eagervm.UninitializedError):
        vm.empty([2]).__dlpack__()

    class OnCuda:
        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, **kw):
            raise AssertionError("not asked for: the device is checked first")

    # CUDA memory needs the VM to have that CUDA device (test_dlpack_cuda.py).
    with pytest.raises(eagervm.DeviceError, match="cuda:0"):
        vm.from_dlpack(OnCuda())


def test_a_failed_array_raises_its_error_at_export(vm):
    (bad,) = vm.call("fail", [], outputs=[([2], np.float32)])
    with pytest.raises(eagervm.KernelError):
        np.from_dlpack(bad)


def test_a_legacy_only_producer(vm):
    class Legacy:
        """A producer that knows no keywords: gets called without max_version."""

        def __init__(self, a):
            self.a = a

        def __dlpack__(self):
            return self.a.__dlpack__()

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    a = np.arange(4, dtype=np.int64)
    x = vm.from_dlpack(Legacy(a))
    a[3] = 9
    np.testing.assert_array_equal(x.numpy(), [0, 1, 2, 9])


TORCH = "PyTorch is not installed (optional; CI does not install it)"


def test_dlpack_torch_cpu(vm, device):
    torch = pytest.importorskip("torch", reason=TORCH)
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    x = eagervm.from_dlpack(t, vm=vm, device=device)
    back = torch.from_dlpack(x.relu() * 3.0)
    assert torch.equal(back, t * 3)


def test_torch_shares_memory_both_ways(vm):
    torch = pytest.importorskip("torch", reason=TORCH)
    for dtype in (torch.float32, torch.int64):
        t = torch.arange(6, dtype=dtype)
        x = vm.from_dlpack(t, copy=False)
        t[0] = 40
        assert x.numpy()[0] == 40, "the VM's array is the tensor's memory"
        y = x * 2.0 if dtype == torch.float32 else x + x
        v = torch.from_dlpack(y)
        assert v.dtype == dtype
        assert v.tolist() == [80, 2, 4, 6, 8, 10]
        in_place(vm, "fill", [], y, scalar=1.0)
        y.wait()
        assert v.tolist() == [1] * 6, "torch's tensor is the VM's storage"
        del y
        vm.sync()
        assert v.tolist() == [1] * 6, "still valid after the VM released it"
    # Not contiguous: copied.
    m = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    np.testing.assert_array_equal(vm.from_dlpack(m.T).numpy(), m.T.numpy())
    with pytest.raises(BufferError):
        vm.from_dlpack(m.T, copy=False)
    with pytest.raises(TypeError, match="no dtype for the DLPack dtype"):
        vm.from_dlpack(torch.ones(2, dtype=torch.int16))


def test_torch_s_deleter_runs_once(vm):
    torch = pytest.importorskip("torch", reason=TORCH)
    a = np.arange(1000, dtype=np.float32)
    before = sys.getrefcount(a)
    t = torch.from_numpy(a)  # torch's storage holds `a`
    x = vm.from_dlpack(t, copy=False)
    del t
    gc.collect()
    assert sys.getrefcount(a) == before + 1, "the VM's storage holds torch's tensor"
    a[0] = 1000.0
    assert x.sum().item() == sum(range(1000)) + 1000
    del x
    vm.sync()
    gc.collect()
    assert sys.getrefcount(a) == before, "torch's deleter ran once when the VM freed its array"


def test_exports_and_imports_from_several_threads(vm):
    base = vm.array(np.arange(256, dtype=np.float32))
    errors = []

    def work(k):
        try:
            for i in range(100):
                y = base * float(k)
                v = np.from_dlpack(y)
                del y  # released while the view lives
                a = np.full(256, float(i), np.float32)
                x = vm.from_dlpack(a)
                np.testing.assert_array_equal(v, np.arange(256, dtype=np.float32) * k)
                assert x.sum().item() == 256.0 * i
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_arrays_from_several_threads(vm, device):
    base = vm.array(np.ones(64, np.float32), device)
    errors, results = [], {}

    def work(i):
        try:
            x = base
            for _ in range(200):
                x = x + base
            results[i] = x.sum().item()
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert results == {i: 64.0 * 201 for i in range(4)}


def test_waits_release_the_gil():
    # While one thread waits on a slow device, another runs Python code.
    vm = eagervm.VM(mock_devices=1, mock_launch_delay_us=100_000)
    x = vm.array(np.ones(4, np.float32), "mock:0")
    y = x * 2.0
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.005)

    t = threading.Thread(target=ticker)
    t.start()
    try:
        np.testing.assert_array_equal(y.numpy(), [2.0] * 4)
    finally:
        stop.set()
        t.join()
    assert len(ticks) >= 10, f"the other thread ran only {len(ticks)} times during the wait"


def test_a_flush_that_meets_back_pressure_releases_the_gil():
    # Every second call fills the batch (flush_every=2); with at most 4 instructions in
    # flight on a device that takes 20 ms each, most flushes wait for the VM. The calls'
    # own batches never fill (batch_size), so every wait is a flush's.
    vm = eagervm.VM(mock_devices=1, mock_launch_delay_us=20_000, high_water=4, low_water=2, batch_size=4096, flush_every=2)
    x = vm.zeros(4, device="mock:0")
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.005)

    t = threading.Thread(target=ticker)
    t.start()
    t0 = time.perf_counter()
    try:
        for _ in range(24):
            x = x + 1.0
    finally:
        issued = time.perf_counter() - t0
        stop.set()
        t.join()
    assert issued > 0.2, f"the calls did not meet back-pressure ({issued:.3f} s)"
    assert len(ticks) >= 0.25 * issued / 0.005, f"the other thread ran {len(ticks)} times in {issued:.3f} s"
    assert x.tolist() == [24.0] * 4


@pytest.mark.skipif(not hasattr(signal, "SIGALRM"), reason="needs SIGALRM")
def test_keyboard_interrupt_ends_a_long_wait():
    vm = eagervm.VM(mock_devices=1, mock_launch_delay_us=3_000_000)
    x = vm.array(np.ones(4, np.float32), "mock:0")
    y = x * 2.0
    signal.signal(signal.SIGALRM, signal.default_int_handler)
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    t0 = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            y.numpy()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    assert time.perf_counter() - t0 < 2.0, "the interrupt did not end the wait"
