"""Values against NumPy for every built-in op, on cpu:0 and mock:0."""

import numpy as np
import pytest

import eagervm

rng = np.random.default_rng(3)


def f32(*shape):
    return rng.uniform(-2, 2, shape).astype(np.float32)


def i64(*shape):
    return rng.integers(-50, 50, shape).astype(np.int64)


@pytest.mark.parametrize("make", [f32, i64])
def test_elementwise(vm, device, make):
    a, b = make(4, 5), make(4, 5)
    x, y = vm.array(a, device), vm.array(b, device)
    np.testing.assert_allclose((x + y).numpy(), a + b, rtol=1e-6)
    np.testing.assert_allclose((x - y).numpy(), a - b, rtol=1e-6)
    np.testing.assert_allclose((x * y).numpy(), a * b, rtol=1e-6)
    np.testing.assert_allclose(x.add(y).numpy(), a + b, rtol=1e-6)
    np.testing.assert_allclose(x.sub(y).numpy(), a - b, rtol=1e-6)
    np.testing.assert_allclose(x.mul(y).numpy(), a * b, rtol=1e-6)
    np.testing.assert_array_equal(x.relu().numpy(), np.maximum(a, 0))
    assert (x + y).dtype == a.dtype
    assert (x + y).device == device


def test_scale_and_scalar_operators(vm, device):
    a = f32(3, 3)
    x = vm.array(a, device)
    np.testing.assert_allclose(x.scale(1.5).numpy(), a * np.float32(1.5), rtol=1e-6)
    np.testing.assert_allclose((x * 2).numpy(), a * 2, rtol=1e-6)
    np.testing.assert_allclose((3.0 * x).numpy(), a * 3, rtol=1e-6)
    np.testing.assert_allclose((x / 4).numpy(), a / 4, rtol=1e-6)
    np.testing.assert_allclose((-x).numpy(), -a, rtol=1e-6)
    np.testing.assert_allclose((x + 1).numpy(), a + 1, rtol=1e-6)
    np.testing.assert_allclose((1 - x).numpy(), 1 - a, rtol=1e-6)
    np.testing.assert_allclose((2 / x).numpy(), 2 / a, rtol=1e-5)
    k = vm.array(np.array([7, -7, 3], dtype=np.int64), device)
    np.testing.assert_array_equal(k.scale(2.9).numpy(), [14, -14, 6])  # factor truncated to 2


@pytest.mark.parametrize("make", [f32, i64])
def test_matmuls(vm, device, make):
    a, b = make(3, 4), make(4, 5)
    x, y = vm.array(a, device), vm.array(b, device)
    np.testing.assert_allclose((x @ y).numpy(), a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x.matmul(y).numpy(), a @ b, rtol=1e-5, atol=1e-5)
    c = make(3, 5)
    z = vm.array(c, device)
    np.testing.assert_allclose(x.matmul_tn(z).numpy(), a.T @ c, rtol=1e-5, atol=1e-5)
    d = make(6, 4)
    w = vm.array(d, device)
    np.testing.assert_allclose(x.matmul_nt(w).numpy(), a @ d.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("make", [f32, i64])
def test_reductions_and_bias(vm, device, make):
    a, bias = make(6, 4), make(4)
    x, b = vm.array(a, device), vm.array(bias, device)
    s = x.sum()
    assert s.shape == ()
    np.testing.assert_allclose(s.numpy(), a.sum(), rtol=1e-5)
    np.testing.assert_allclose(s.item(), a.sum(), rtol=1e-5)
    np.testing.assert_allclose(x.sum_rows().numpy(), a.sum(axis=0), rtol=1e-5)
    np.testing.assert_allclose(x.add_bias(b).numpy(), a + bias, rtol=1e-6)


def test_relu_grad(vm, device):
    a, dy = f32(5, 5), f32(5, 5)
    a[0, 0] = 0.0
    x, g = vm.array(a, device), vm.array(dy, device)
    np.testing.assert_array_equal(x.relu_grad(g).numpy(), np.where(a > 0, dy, 0))


def test_fill_and_copies(vm, device):
    z = vm.zeros([2, 3], device=device)
    np.testing.assert_array_equal(z.numpy(), np.zeros((2, 3), np.float32))
    f = vm.full([4], 2.5, dtype=np.float32, device=device)
    np.testing.assert_array_equal(f.numpy(), np.full(4, 2.5, np.float32))
    k = vm.full([2], 9, dtype="int64", device=device)
    assert k.dtype == np.int64
    np.testing.assert_array_equal(k.numpy(), [9, 9])
    a = f32(8)
    x = vm.array(a)
    on = x.to(device)
    assert on.device == device
    back = on.relu().to("cpu:0")
    assert back.device == "cpu:0"
    np.testing.assert_array_equal(back.numpy(), np.maximum(a, 0))
    other = "mock:1"
    np.testing.assert_array_equal(on.to(other).to(device).numpy(), a)
    assert x.to("cpu:0") is x


def test_metadata_and_numpy_protocol(vm, device):
    a = i64(2, 3, 4)
    x = vm.array(a, device)
    assert x.shape == (2, 3, 4) and x.ndim == 3 and x.numel() == 24
    assert x.size() == (2, 3, 4) and x.size(1) == 3 and x.size(-1) == 4 and x.dim() == 3
    assert x.dtype == np.dtype(np.int64) and x.dtype is eagervm.int64
    np.testing.assert_array_equal(np.asarray(x), a)
    assert repr(x).startswith("tensor([[[")
    e = vm.array(np.zeros((0, 3), np.float32), device)
    assert e.numpy().shape == (0, 3)


def test_the_source_array_may_change_after_the_call(vm, device):
    a = f32(16)
    x = vm.array(a, device)
    expect = a.copy()
    a[:] = 0
    np.testing.assert_array_equal(x.numpy(), expect)


def test_calls_return_before_the_work_runs():
    # A slow mock device: 200 calls of 2 ms each would take 0.4 s if each call waited.
    import time

    vm = eagervm.VM(mock_devices=1, mock_launch_delay_us=2000)
    x = vm.array(np.ones(4, np.float32), "mock:0")
    t0 = time.perf_counter()
    for _ in range(200):
        x = x * 1.0
    issued = time.perf_counter() - t0
    assert issued < 0.2, f"issuing 200 calls took {issued:.3f} s"
    np.testing.assert_array_equal(x.numpy(), np.ones(4, np.float32))


def test_generic_call_and_op_names(vm, device):
    assert {"add", "matmul", "relu", "fill", "fail"} <= set(vm.op_names())
    a = f32(3)
    (y,) = vm.call("relu", [vm.array(a, device)])
    np.testing.assert_array_equal(y.numpy(), np.maximum(a, 0))
    (z,) = vm.call("fill", [], scalar=4.0, outputs=[([2], np.float32)], device=device)
    np.testing.assert_array_equal(z.numpy(), [4.0, 4.0])


def test_synchronous_mode():
    vm = eagervm.VM(sync=True)
    assert vm.config["sync"] is True
    a = f32(3, 3)
    np.testing.assert_allclose((vm.array(a) @ vm.array(a)).numpy(), a @ a, rtol=1e-5)
