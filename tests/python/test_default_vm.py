"""The module's functions without a VM named: the default VM (made on first use from the
EAGERVM_* variables), `with vm:` (per thread, nestable) and `set_default_vm` (per
process), and PyTorch's signatures and dtype rules of the creation functions."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import eagervm


def belongs_to(x, vm):
    """Whether `x` is an array of `vm` (an op with an array of another VM is refused)."""
    try:
        (x + vm.zeros(x.shape, dtype=x.dtype, device=x.device)).wait()
        return True
    except eagervm.ForeignTensorError:
        return False


def test_the_default_vm_is_made_once_and_used_by_every_function():
    vm = eagervm.default_vm()
    assert vm is eagervm.default_vm()
    for x in [
        eagervm.tensor([1, 2]),
        eagervm.zeros(2),
        eagervm.ones(2, 3),
        eagervm.empty(2).fill_(0),
        eagervm.full((2,), 1.5),
        eagervm.arange(3),
        eagervm.from_numpy(np.arange(3.0)),
        eagervm.from_dlpack(np.arange(3.0)),
    ]:
        assert belongs_to(x, vm)


def test_with_makes_a_vm_the_default_in_its_block_and_blocks_nest():
    a, b = eagervm.VM(mock_devices=1), eagervm.VM()
    outer = eagervm.default_vm()
    with a as entered:
        assert entered is a and eagervm.default_vm() is a
        x = eagervm.zeros(2, device="mock:0")  # a has the mock device; the default VM need not
        assert belongs_to(x, a)
        with b:
            assert eagervm.default_vm() is b and belongs_to(eagervm.ones(2), b)
        assert eagervm.default_vm() is a
        like = eagervm.zeros_like(eagervm.tensor([1.0]))
        assert belongs_to(like, a)
    assert eagervm.default_vm() is outer
    # An exception leaves the block too.
    with pytest.raises(KeyError):
        with b:
            raise KeyError
    assert eagervm.default_vm() is outer


def test_with_is_per_thread_and_set_default_vm_per_process():
    a, b = eagervm.VM(), eagervm.VM()
    seen = {}

    def other():
        seen["during"] = eagervm.default_vm()

    with a:
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert seen["during"] is not a, "a `with` block of one thread is not another's"
    try:
        eagervm.set_default_vm(b)
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert seen["during"] is b and eagervm.default_vm() is b
        with a:
            assert eagervm.default_vm() is a  # a block wins over the process default
    finally:
        eagervm.set_default_vm(None)
    made = eagervm.default_vm()
    assert made is not b and made is eagervm.default_vm()


def test_the_default_vm_takes_the_environment():
    code = "import eagervm; x = eagervm.zeros(2, device='mock:1'); print(x.device, eagervm.default_vm().config['batch_size'])"
    env = dict(os.environ, EAGERVM_MOCK_DEVICES="2", EAGERVM_BATCH="33")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["mock:1", "33"]
    env = dict(os.environ, EAGERVM_SYNC="maybe")
    out = subprocess.run([sys.executable, "-c", "import eagervm; eagervm.zeros(2)"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode != 0 and "ConfigError" in out.stderr and "EAGERVM_SYNC" in out.stderr


def test_creation_signatures_and_dtypes_are_pytorch_s(vm):
    with vm:
        for x in (eagervm.zeros(2, 3), eagervm.zeros((2, 3)), eagervm.zeros([2, 3]), eagervm.zeros(np.int64(2), 3)):
            assert x.shape == (2, 3) and x.dtype is eagervm.float32 and x.device == "cpu:0"
        assert eagervm.zeros(()).shape == () and eagervm.zeros([]).shape == ()
        assert eagervm.ones(2, dtype=eagervm.int32).tolist() == [1, 1]
        assert eagervm.ones(2, dtype=np.float64).dtype is eagervm.float64
        assert eagervm.ones(2, dtype="bool").tolist() == [True, True]
        assert eagervm.zeros(1, dtype=float).dtype is eagervm.float64  # Python's float is float64
        assert eagervm.full((2,), True).dtype is eagervm.bool
        assert eagervm.full((2,), 3).dtype is eagervm.int64
        assert eagervm.full([2], 2.5).dtype is eagervm.float32
        assert eagervm.full(2, 2.5, dtype=eagervm.int32).tolist() == [2, 2]
        assert eagervm.arange(4).tolist() == [0, 1, 2, 3] and eagervm.arange(4).dtype is eagervm.int64
        assert eagervm.arange(1, 7, 2).tolist() == [1, 3, 5]
        assert eagervm.arange(0, 1, 0.25).tolist() == [0.0, 0.25, 0.5, 0.75]
        assert eagervm.arange(0, 1, 0.25).dtype is eagervm.float32
        assert eagervm.arange(5, 0, -2).tolist() == [5, 3, 1]
        assert eagervm.arange(3, dtype=eagervm.float64).dtype is eagervm.float64
        assert eagervm.arange(2.0).dtype is eagervm.float32
        x = eagervm.zeros(2, 3, device="mock:0", dtype=eagervm.float16)
        assert x.device == "mock:0" and x.dtype is eagervm.float16
        assert eagervm.empty(2, 2, device=eagervm.device("mock:1")).device == "mock:1"
    y = vm.tensor([[1, 2], [3, 4]], dtype=eagervm.int32, device="mock:0")
    for like, fill in [(eagervm.zeros_like, 0), (eagervm.ones_like, 1)]:
        z = like(y)
        assert z.shape == (2, 2) and z.dtype is eagervm.int32 and z.device == "mock:0" and z.tolist() == [[fill] * 2] * 2
    f = eagervm.full_like(y, 7.9)
    assert f.dtype is eagervm.int32 and f.tolist() == [[7, 7], [7, 7]]
    assert eagervm.full_like(y, 1.5, dtype=eagervm.float32).tolist() == [[1.5, 1.5], [1.5, 1.5]]
    e = eagervm.empty_like(y, device="cpu:0")
    assert e.device == "cpu:0" and e.shape == (2, 2)
    with pytest.raises(eagervm.UninitializedError):
        e.numpy()
    e.fill_(3)
    assert e.tolist() == [[3, 3], [3, 3]]


def test_creation_errors(vm):
    with vm:
        with pytest.raises(ValueError, match="arange"):
            eagervm.arange(0, 5, 0)
        with pytest.raises(ValueError, match="arange"):
            eagervm.arange(5, 0, 1)
        with pytest.raises(TypeError, match="fill_value.*must be a number"):
            eagervm.full((2,), "x")
        with pytest.raises(TypeError, match="must be a number"):
            eagervm.arange("3")
        with pytest.raises(eagervm.DeviceError, match="mock:9"):
            eagervm.zeros(2, device="mock:9")
        with pytest.raises(TypeError, match="device must be"):
            eagervm.zeros(2, device=1.5)
        with pytest.raises(TypeError):
            eagervm.zeros(2, requires_grad=True)
