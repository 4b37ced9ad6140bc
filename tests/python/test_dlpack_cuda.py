"""DLPack exchange of CUDA memory (docs/python.md, "DLPack").

The tests at the top run everywhere: the error paths, with forged CUDA producers. The rest
need PyTorch with CUDA and a VM that can open cuda:0, and skip with the reason otherwise.
"""

import ctypes
import gc

import numpy as np
import pytest

import eagervm

# ---------------------------------------------------------------------------------------
# A producer of a hand-made DLPack capsule (dlpack.h's legacy DLManagedTensor), with a
# deleter that counts its calls.


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", DELETER),
]

CAPSULE_NEW = ctypes.pythonapi.PyCapsule_New
CAPSULE_NEW.restype = ctypes.py_object
CAPSULE_NEW.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class Forged:
    """A producer of `n` float32s at `data` that says it is on DLPack device `says`
    (``__dlpack_device__``) and whose capsule names device `capsule_device`."""

    def __init__(self, data, n, says, capsule_device=None):
        self.says = says
        self.calls = []  # the keywords of each __dlpack__ call
        self.deleted = 0
        self.shape = (ctypes.c_int64 * 1)(n)
        self.deleter = DELETER(self._delete)
        dev = capsule_device or says
        self.managed = DLManagedTensor(
            DLTensor(data, DLDevice(*dev), 1, DLDataType(2, 32, 1), self.shape, None, 0),
            None,
            self.deleter,
        )

    def _delete(self, _):
        self.deleted += 1

    def __dlpack_device__(self):
        return self.says

    def __dlpack__(self, **kw):
        self.calls.append(kw)
        return CAPSULE_NEW(ctypes.addressof(self.managed), b"dltensor", None)


def test_host_and_mock_arrays_say_they_are_on_the_cpu(vm):
    assert vm.array(np.ones(2, np.float32)).__dlpack_device__() == (1, 0)
    assert vm.array(np.ones(2, np.float32), "mock:0").__dlpack_device__() == (1, 0)


def test_a_cuda_producer_is_refused_by_a_vm_without_that_device(vm):
    p = Forged(0x7F0000000000, 4, (2, 0))
    with pytest.raises(eagervm.DeviceError, match="cuda:0"):
        vm.from_dlpack(p)
    assert p.calls == [], "refused before the producer was asked for its memory"
    with pytest.raises(BufferError, match="device=None"):
        vm.from_dlpack(p, device="cpu:0")
    q = Forged(0x7F0000000000, 4, (2, 3))
    with pytest.raises(eagervm.DeviceError, match="cuda:3"):
        eagervm.from_dlpack(q, vm=vm)
    with pytest.raises(BufferError, match="ordinal"):
        vm.from_dlpack(Forged(0x7F0000000000, 4, (2, -1)))


def test_a_capsule_of_cuda_memory_behind_a_host_producer_is_refused(vm):
    # The producer says CPU but hands over a capsule of CUDA memory: the capsule's device
    # decides, and the producer's deleter still runs, once.
    p = Forged(0x7F0000000000, 4, (1, 0), capsule_device=(2, 0))
    with pytest.raises(BufferError, match=r"host memory, not memory of DLPack device \(2, 0\)"):
        vm.from_dlpack(p)
    assert len(p.calls) == 1
    gc.collect()
    assert p.deleted == 1


def test_a_host_export_takes_no_stream_and_no_cuda_device(vm):
    x = vm.array(np.ones(2, np.float32))
    with pytest.raises(BufferError, match="stream"):
        x.__dlpack__(stream=1)
    with pytest.raises(BufferError, match=r"not to \(2, 0\)"):
        x.__dlpack__(dl_device=(2, 0))
    m = vm.array(np.ones(2, np.float32), "mock:0")
    with pytest.raises(BufferError, match="stream"):
        m.__dlpack__(stream=1)


# ---------------------------------------------------------------------------------------
# On a GPU.


@pytest.fixture
def cuda():
    """(torch, a VM with cuda:0), or a skip that says what is missing."""
    try:
        import torch
    except ImportError:
        pytest.skip("PyTorch is not installed (optional; CI does not install it)")
    if not torch.cuda.is_available():
        pytest.skip("torch.cuda is not available (no GPU, or a CPU-only PyTorch)")
    try:
        vm = eagervm.VM(cuda_devices=1)
    except eagervm.Error as e:
        pytest.skip(f"the VM cannot open cuda:0: {e}")
    torch.cuda.set_device(0)
    return torch, vm


DTYPES = ["float32", "int64"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_cuda_to_eagervm_to_torch_cuda(cuda, dtype):
    torch, vm = cuda
    tdt = getattr(torch, dtype)
    t = torch.arange(12, dtype=tdt, device="cuda:0").reshape(3, 4)
    x = vm.from_dlpack(t)
    assert (x.device, x.dtype, x.shape) == ("cuda:0", np.dtype(dtype), (3, 4))
    assert x.__dlpack_device__() == (2, 0)
    back = torch.from_dlpack(x)
    assert back.device == t.device and back.data_ptr() == t.data_ptr(), "no copy either way"
    y = torch.from_dlpack(x * 2.0)
    assert y.device == t.device
    assert torch.equal(y, t * 2)
    np.testing.assert_array_equal(x.numpy(), t.cpu().numpy())


EVERY_DTYPE = ["bool", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


@pytest.mark.parametrize("dtype", EVERY_DTYPE)
def test_views_broadcasting_and_comparisons_on_cuda_match_torch(cuda, dtype):
    torch, vm = cuda
    tdt = getattr(torch, dtype)
    t = (torch.arange(24, device="cuda:0") % 7 - 3).to(tdt).reshape(2, 3, 4)
    x = vm.from_dlpack(t)
    assert x.device == "cuda:0" and x.dtype == getattr(eagervm, dtype)
    # A strided view: x[0] with every other column, [3, 2], transposed to [2, 3].
    xv, tv = x[0, :, ::2].transpose(0, 1), t[0, :, ::2].transpose(0, 1)
    xr, tr = x[1, 0, :3], t[1, 0, :3]
    cases = [
        ("view", xv, tv),
        ("broadcast add", xv + xr, tv + tr),
        ("broadcast mul", xv * xr, tv * tr),
        ("comparison", xv < xr, tv < tr),
        ("cast", xv.to(eagervm.float32), tv.float()),
        ("number", xv.to(eagervm.float64) * 2.5, tv.double() * 2.5),
    ]
    for what, got, want in cases:
        back = torch.from_dlpack(got.contiguous())
        assert back.dtype == want.dtype, f"{what}: {back.dtype} != {want.dtype}"
        assert torch.equal(back, want.contiguous()), f"{what}: {back} != {want}"
    # In place through a view, into the storage torch shares.
    x[:, 1] = 0
    t2 = torch.from_dlpack(x)
    assert t2.data_ptr() == t.data_ptr() and not t[:, 1].to(torch.float32).any()


def test_memory_is_shared_both_ways(cuda):
    torch, vm = cuda
    t = torch.zeros(8, device="cuda:0")
    x = vm.from_dlpack(t)
    # Written through torch after the import: ordered with the VM by waiting for torch.
    t[0] = 40.0
    torch.cuda.current_stream().synchronize()
    assert x.numpy()[0] == 40.0
    # A VM op's result, seen and written by torch in place, without a host copy.
    z = x + x
    tz = torch.from_dlpack(z)
    assert tz[0].item() == 80.0
    tz[1] = 7.0
    torch.cuda.current_stream().synchronize()
    assert z.numpy()[1] == 7.0
    # The VM writes the imported memory in place; torch sees it once the write is done.
    with vm.program() as p:
        p.call_into("scale", [z], [x], stream=vm.stream("cuda:0", "compute"), scalar=0.5)
    x.wait()
    assert t[1].item() == 3.5


def test_a_consumer_stream_waits_for_the_vm_s_writes_on_the_device(cuda):
    torch, vm = cuda
    n = 1 << 20
    one = vm.full([n], 1.0, device="cuda:0")
    x = vm.full([n], 0.0, device="cuda:0")
    for _ in range(300):
        x = x + one
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        t = torch.from_dlpack(x)  # passes `side` as the stream: it waits on the device
        done = torch.all(t == 300.0)
    side.synchronize()
    assert done.item()
    # stream=None: the legacy default stream, torch's default stream.
    y = x * 2.0
    t = torch.from_dlpack(y.__dlpack__())
    assert torch.all(t == 600.0).item()
    # stream=-1: no ordering; the consumer waits for the array itself.
    z = y + one
    z.wait()
    t = torch.from_dlpack(z.__dlpack__(stream=-1))
    assert torch.all(t == 601.0).item()
    with pytest.raises(ValueError, match="ambiguous"):
        z.__dlpack__(stream=0)


def test_host_copies_on_request(cuda):
    torch, vm = cuda
    x = vm.full([4], 2.5, device="cuda:0")
    for kw in ({"dl_device": (1, 0)}, {"copy": True}):
        h = torch.from_dlpack(x.__dlpack__(**kw))
        assert h.device.type == "cpu" and torch.equal(h, torch.full((4,), 2.5))
    with pytest.raises(BufferError, match="copy=False"):
        x.__dlpack__(dl_device=(1, 0), copy=False)


def test_an_export_outlives_the_array_and_the_vm(cuda):
    torch, _ = cuda
    vm = eagervm.VM(cuda_devices=1)
    x = vm.full([1000], 3.0, device="cuda:0")
    t = torch.from_dlpack(x * 1.0)
    del x, vm
    gc.collect()
    torch.cuda.synchronize()
    assert torch.all(t == 3.0)
    t.add_(1.0)
    assert torch.all(t == 4.0)
    del t  # the loan ends: the device is waited for, the block goes back


def test_the_producer_s_deleter_runs_once_when_the_vm_frees_it(cuda):
    torch, vm = cuda
    # Tensors of earlier tests whose deleters are still queued (the binding runs them at its
    # next call) or whose last reference is in a cycle go first, so that `base` holds no
    # block that is freed during this test.
    vm.sync()
    gc.collect()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    n = 1 << 22
    t = torch.ones(n, device="cuda:0")
    assert torch.cuda.memory_allocated() == base + 4 * n
    x = vm.from_dlpack(t)
    del t
    gc.collect()
    assert torch.cuda.memory_allocated() == base + 4 * n, "the VM's array holds torch's tensor"
    assert x.sum().item() == n
    del x
    vm.sync()  # the release has run, and queued the producer's tensor for its deleter
    vm.sync()  # ... which the binding calls at its next call
    gc.collect()
    assert torch.cuda.memory_allocated() == base, "torch's deleter ran when the VM freed it"


def test_what_cannot_be_imported_without_a_copy(cuda):
    torch, vm = cuda
    t = torch.arange(12, dtype=torch.float32, device="cuda:0").reshape(3, 4)
    with pytest.raises(BufferError, match="contiguous"):
        vm.from_dlpack(t.t())
    with pytest.raises(BufferError, match="aligned"):
        vm.from_dlpack(t.reshape(-1)[1:])
    c = vm.from_dlpack(t, copy=True)
    t.zero_()
    assert c.numpy()[2, 3] == 11.0, "a copy, made before from_dlpack returned"
    with pytest.raises(eagervm.DeviceError, match="cuda:0"):
        eagervm.VM(cuda_devices=0).from_dlpack(t)
    with pytest.raises(BufferError, match="device=None"):
        vm.from_dlpack(t, device="cpu:0")


def test_an_address_the_driver_does_not_know_is_refused(cuda):
    _, vm = cuda
    # The first page is never mapped: no allocation of any library is there.
    p = Forged(0x1000, 4, (2, 0))
    with pytest.raises(eagervm.DeviceError, match="0x1000"):
        vm.from_dlpack(p)
    assert p.calls[0]["stream"] not in (None, 0, 1, 2, -1), "the VM's own stream"
    gc.collect()
    vm.sync()
    assert p.deleted == 1


FLOATING = ["float16", "bfloat16", "float32", "float64"]
# The functions of one input with a CUDA kernel (docs/cuda.md, "Kernels"), as methods.
MATH = ["exp", "exp2", "log", "log2", "log1p", "expm1", "sqrt", "rsqrt", "reciprocal",
        "sin", "cos", "tanh", "sigmoid", "erf"]
NUMERIC = ["neg", "abs", "sign", "floor", "ceil", "round"]
PREDICATES = ["isnan", "isinf", "isfinite", "logical_not"]


def _special_values(torch, tdt):
    """A [2, 3, 4] tensor on cuda:0 from -3 to 3 with NaN, +inf and -inf in it."""
    t = torch.linspace(-3.0, 3.0, 24, dtype=torch.float64, device="cuda:0").reshape(2, 3, 4)
    t[0, 0, 0], t[1, 2, 3], t[1, 1, 1] = float("nan"), float("inf"), float("-inf")
    return t.to(tdt)


def _close(torch, got, want, what):
    back = torch.from_dlpack(got.contiguous())
    assert back.dtype == want.dtype, f"{what}: {back.dtype} != {want.dtype}"
    # float32 and float64: the CUDA library's functions against PyTorch's, a few ulps apart;
    # 16-bit: computed in float32 and rounded once, as PyTorch does.
    tol = {torch.float32: (1e-5, 1e-6), torch.float64: (1e-12, 1e-12)}.get(want.dtype)
    kw = dict(rtol=tol[0], atol=tol[1]) if tol else {}
    torch.testing.assert_close(back, want.contiguous(), equal_nan=True, msg=lambda m: f"{what}: {m}", **kw)


@pytest.mark.parametrize("dtype", FLOATING)
def test_pointwise_math_on_cuda_views_matches_torch(cuda, dtype):
    torch, vm = cuda
    t = _special_values(torch, getattr(torch, dtype))
    x = vm.from_dlpack(t)
    # A strided view, so that the kernels index through strides.
    xv, tv = x[:, ::2, 1:].transpose(0, 2), t[:, ::2, 1:].transpose(0, 2)
    for name in MATH + NUMERIC + PREDICATES:
        _close(torch, getattr(xv, name)(), getattr(tv, name)(), name)
    F = eagervm.nn.functional
    _close(torch, F.silu(xv), torch.nn.functional.silu(tv), "silu")
    for approximate in ("none", "tanh"):
        got, want = F.gelu(xv, approximate=approximate), torch.nn.functional.gelu(tv, approximate=approximate)
        _close(torch, got, want, f"gelu({approximate})")
    # Two inputs, broadcast, NaN propagating.
    xr, tr = x[1, 0], t[1, 0]
    for name in ("maximum", "minimum"):
        _close(torch, getattr(eagervm, name)(xv, xr[:2]), getattr(torch, name)(tv, tr[:2]), name)


@pytest.mark.parametrize("dtype", ["uint8", "int32", "int64", "bool"])
def test_integer_pointwise_on_cuda_matches_torch(cuda, dtype):
    torch, vm = cuda
    tdt = getattr(torch, dtype)
    t = (torch.arange(24, device="cuda:0") % 7 - 3).to(tdt).reshape(2, 3, 4)
    x = vm.from_dlpack(t)
    xv, tv = x[:, ::2].transpose(0, 2), t[:, ::2].transpose(0, 2)
    names = PREDICATES + ([] if dtype == "bool" else ["abs", "sign", "floor", "ceil", "round"])
    if dtype not in ("bool", "uint8"):
        names.append("neg")
    for name in names:
        try:
            want = getattr(tv, name)()
        except (RuntimeError, NotImplementedError):
            continue  # PyTorch has no such kernel for this dtype: nothing to compare with
        _close(torch, getattr(xv, name)(), want, name)
    _close(torch, eagervm.maximum(xv, x[0, 0, :2]), torch.maximum(tv, t[0, 0, :2]), "maximum")


def test_a_pytorch_forward_pass_on_cuda_matches_torch_on_cuda(cuda):
    # test_port.py's forward pass (convolution, pooling, linear, GELU, layer norm, cross
    # entropy, causal attention, softmax, reductions, argmax), every op on cuda:0.
    torch, vm = cuda
    from test_port import forward

    import torch.nn.functional as TF

    torch.backends.cudnn.allow_tf32 = False  # PyTorch's convolutions would round to TF32
    torch.backends.cuda.matmul.allow_tf32 = False
    rng = np.random.default_rng(0)
    shapes = [(8, 1, 8, 8), (32, 64), (32,), (10, 32), (10,), (4, 1, 3, 3)]
    floats = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    target = rng.integers(0, 10, size=(8,)).astype(np.int64)
    qkv = [rng.standard_normal((2, 4, 16, 8)).astype(np.float32) for _ in range(3)]
    arrays = floats + [target] + qkv
    want = forward(TF, *[torch.from_numpy(a.copy()).to("cuda:0") for a in arrays])
    got = forward(eagervm.nn.functional, *[vm.tensor(a, device="cuda:0") for a in arrays])
    for w, g in zip(want, got):
        assert g.device == "cuda:0"
        w, g = w.cpu().numpy(), g.to("cpu:0").numpy()
        assert w.shape == g.shape and w.dtype == g.dtype
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
