"""Errors: one exception class per Error kind, raised where Rust returns them; bad input
from Python is a TypeError or ValueError."""

import numpy as np
import pytest

import eagervm


def test_every_error_class_derives_from_the_base():
    names = [n for n in eagervm.__all__ if n.endswith("Error") and n != "Error"]
    assert len(names) == 23
    for n in names:
        assert issubclass(getattr(eagervm, n), eagervm.Error)
    assert issubclass(eagervm.Error, Exception)


def test_bad_arguments_are_also_the_builtin_errors_pytorch_raises():
    for name in ["InvalidOperandsError", "OverlapError", "TooLargeError"]:
        assert issubclass(getattr(eagervm, name), ValueError), name
    assert issubclass(eagervm.OutOfRangeError, IndexError)
    assert issubclass(eagervm.OutOfRangeError, eagervm.InvalidOperandsError)
    assert issubclass(eagervm.DTypeError, TypeError)
    for name in ["KernelError", "FailedError", "DeviceError", "ReleasedError"]:
        assert not issubclass(getattr(eagervm, name), (ValueError, IndexError, TypeError)), name
    assert eagervm.InvalidOperandsError.__module__ == "eagervm"


def test_refused_calls_raise_at_the_call(vm, device):
    x = vm.array(np.ones(3, np.float32), device)
    with pytest.raises(eagervm.InvalidOperandsError, match=r"add.*f32\[3\].*f32\[4\].*do not broadcast"):
        x + vm.array(np.ones(4, np.float32), device)
    with pytest.raises(ValueError, match="do not broadcast"):
        x.add(vm.array(np.ones((2, 4), np.int64), device))
    with pytest.raises(eagervm.WrongDeviceError, match="is on"):
        x + vm.array(np.ones(3, np.float32), "mock:1")
    with pytest.raises(eagervm.UnknownOpError, match="registered ops"):
        vm.call("no_such_op", [x])
    other = eagervm.VM()
    with pytest.raises(eagervm.ForeignTensorError, match="another virtual machine"):
        x.to("cpu:0") + other.array(np.ones(3, np.float32))
    with pytest.raises(eagervm.DeviceError, match="not available: this VM opened 2 mock device"):
        vm.array(np.ones(3, np.float32), "mock:7")
    with pytest.raises(eagervm.AccessError, match="item reads a one-element array"):
        x.item()


def test_a_cuda_device_the_vm_did_not_open_is_refused_saying_why():
    # Without a driver, what the machine lacks (as VM(cuda_devices=1) says); with one, how
    # to open the device.
    with pytest.raises(eagervm.DeviceError, match=r"device cuda:0 is not available: .*(driver|CUDA|cuda_devices)"):
        eagervm.VM().zeros((2,), device="cuda:0")


def test_run_time_failures_raise_at_the_read_and_at_sync(vm, device):
    x = vm.array(np.ones(3, np.float32), device)
    (bad,) = vm.call("fail", [x], outputs=[([3], np.float32)], scalar=13)
    poisoned = (bad + x).sum()
    healthy = (x + x).sum()
    with pytest.raises(eagervm.KernelError, match="fail op: 13"):
        poisoned.numpy()
    with pytest.raises(eagervm.KernelError, match="fail op: 13"):
        poisoned.wait()
    assert healthy.item() == 6.0
    with pytest.raises(eagervm.FailedError, match="1 instruction"):
        vm.sync()
    vm.sync()  # the failure log is empty now


def test_a_panicking_kernel_is_an_exception_not_a_crash(vm):
    x = vm.array(np.ones(2, np.float32))
    (p,) = vm.call("panic", [x], outputs=[([2], np.float32)])
    with pytest.raises(eagervm.PanicError):
        p.numpy()
    with pytest.raises(eagervm.FailedError):
        vm.sync()


def test_released_arrays_are_refused(vm, device):
    x = vm.array(np.ones(3, np.float32), device)
    y = x * 2.0
    x.release()
    np.testing.assert_array_equal(y.numpy(), [2.0, 2.0, 2.0])  # built before the release
    with pytest.raises(eagervm.ReleasedError, match="after it was released"):
        x * 2.0


def test_too_large_and_config_errors():
    vm = eagervm.VM(max_tensor_bytes=64)
    with pytest.raises(eagervm.TooLargeError, match="too large"):
        vm.zeros([100])
    with pytest.raises(eagervm.ConfigError, match="invalid configuration"):
        eagervm.VM(batch_size=0)


def test_a_bad_environment_variable_raises_naming_it(monkeypatch):
    monkeypatch.setenv("EAGERVM_SYNC", "yes")
    with pytest.raises(eagervm.ConfigError, match="EAGERVM_SYNC=\"yes\".*1, 0, true or false"):
        eagervm.VM()
    monkeypatch.setenv("EAGERVM_SYNC", "0")
    monkeypatch.setenv("EAGERVM_MOCK_DEVICES", "abc")
    with pytest.raises(eagervm.ConfigError, match="EAGERVM_MOCK_DEVICES"):
        eagervm.VM(mock_devices=1)


def test_bad_python_input_is_a_type_or_value_error(vm):
    with pytest.raises(TypeError, match="numpy.ndarray"):
        vm.array([1.0, 2.0])
    with pytest.raises(TypeError, match="no dtype for NumPy's int16"):
        vm.array(np.ones(3, np.int16))
    with pytest.raises(TypeError, match="no dtype for NumPy's complex64"):
        eagervm.tensor(np.ones(3, np.complex64))
    with pytest.raises(ValueError, match="unknown device"):
        vm.array(np.ones(3, np.float32), device="gpu:0")
    with pytest.raises(ValueError, match="unknown device"):
        vm.zeros([2], device="mock:x")
    with pytest.raises(ValueError, match="stream type"):
        vm.stream("cpu:0", "sideways")
    with pytest.raises(ValueError, match="mock_devices"):
        eagervm.VM(mock_devices=-1)
    with pytest.raises(TypeError, match="mock_devices must be an int"):
        eagervm.VM(mock_devices="2")
    with pytest.raises(ValueError, match="threads"):
        eagervm.VM(threads="many")
    x = vm.array(np.ones(3, np.float32))
    with pytest.raises(TypeError):
        x + "1.0"
    with pytest.raises(TypeError, match="must be an eagervm array or a number"):
        x.add(np.ones(3, np.float32))
    with pytest.raises(TypeError):
        np.ones(3, np.float32) + x  # NumPy leaves eagervm arrays to eagervm
    with pytest.raises(TypeError, match="sequence of ints"):
        vm.zeros("abc")
    with pytest.raises(TypeError, match="sequence of ints.*float"):
        vm.zeros([2.0, 3])
    with pytest.raises(TypeError, match="dtype must be"):
        vm.zeros(2, dtype=object())


def test_env_variables_are_honoured(monkeypatch):
    monkeypatch.setenv("EAGERVM_MOCK_DEVICES", "3")
    monkeypatch.setenv("EAGERVM_BATCH", "77")
    vm = eagervm.VM()
    assert vm.config["mock_devices"] == 3 and vm.config["batch_size"] == 77
    assert eagervm.VM(mock_devices=1).config["mock_devices"] == 1  # a keyword wins


SIZE_CALLS = [
    ("zeros", lambda f, s: f.zeros(s)),
    ("ones", lambda f, s: f.ones(s)),
    ("empty", lambda f, s: f.empty(s)),
    ("full", lambda f, s: f.full(s, 1.5)),
]


@pytest.mark.parametrize("name, call", SIZE_CALLS, ids=[n for n, _ in SIZE_CALLS])
@pytest.mark.parametrize("on", ["vm", "module"])
def test_negative_and_oversized_sizes_are_value_errors_naming_the_argument(vm, name, call, on):
    f = vm if on == "vm" else eagervm
    for size in ([-1], [2, -3], (4, -1)):
        with pytest.raises(ValueError, match=rf"{name}\(\): argument 'size' has a negative size -\d"):
            call(f, size)
    for big in ([2**64], [3, 2**70], [2**63]):
        with pytest.raises(ValueError, match=rf"{name}\(\): argument 'size' is out of range"):
            call(f, big)
    # Each size fits, the product does not: the VM's size check, a ValueError too.
    with pytest.raises(eagervm.TooLargeError) as e:
        call(f, [2**40, 2**40])
    assert isinstance(e.value, ValueError)


def test_every_call_that_takes_a_shape_refuses_a_negative_size(vm):
    x = vm.zeros(2, 3)
    with pytest.raises(ValueError, match="broadcast_to\\(\\): argument 'size' has a negative size"):
        x.broadcast_to((-2, 3))
    with pytest.raises(ValueError, match="as_strided\\(\\): argument 'size' has a negative size"):
        x.as_strided((-1,), (1,))
    with pytest.raises(ValueError, match="invalid size -2"):
        x.view(-2, 3)
    with pytest.raises(ValueError, match="invalid size -2"):
        x.reshape(3, -2)
    with pytest.raises(ValueError, match="expand"):
        x.expand(-2, 2, 3)
    with pytest.raises(ValueError, match="narrow\\(\\): length must be non-negative"):
        x.narrow(0, 0, -1)
    with pytest.raises(ValueError, match="call\\(\\): argument 'outputs' has a negative size"):
        vm.call("fill", [], outputs=[([-1], np.float32)])
    with pytest.raises(ValueError, match="split\\(\\): argument 'split_size_or_sections' has a negative size"):
        x.split([3, -1], 1)
