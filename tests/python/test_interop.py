"""DLPack round trips, threads and the GIL, KeyboardInterrupt during a wait."""

import os
import signal
import threading
import time

import numpy as np
import pytest

import eagervm


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


def test_dlpack_refuses_what_it_cannot_do(vm):
    x = vm.array(np.ones(2, np.float32))
    with pytest.raises(BufferError, match="copy"):
        x.__dlpack__(copy=False)
    with pytest.raises(BufferError, match="host memory"):
        x.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError):
        vm.from_dlpack(object())


def test_dlpack_torch_cpu(vm, device):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (optional; CI does not install it)")
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    x = eagervm.from_dlpack(t, vm=vm, device=device)
    back = torch.from_dlpack(x.relu() * 3.0)
    assert torch.equal(back, t * 3)


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
