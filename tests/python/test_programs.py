"""The instruction-list API, traces and timelines, and the examples."""

import json
import pathlib
import runpy
import subprocess
import sys

import numpy as np
import pytest

import eagervm

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_program_with_explicit_streams(vm):
    h2d, compute, d2h = (vm.stream("mock:0", t) for t in ("h2d", "compute", "d2h"))
    assert (h2d.device, h2d.type, compute.type, d2h.type) == ("mock:0", "h2d", "compute", "d2h")
    assert len(vm.streams()) == 1 + 3 * 2 + 3  # and a collective stream on each device
    a = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    with vm.program() as p:
        host = vm.empty([2, 3])
        p.write(host, a)
        dev = vm.empty([2, 3], device="mock:0")
        p.call_into("copy", [host], [dev], stream=h2d)
        r = p.call("relu", [dev], stream=compute)
        (s,) = p.call_multi("sum_rows", [r], stream=compute)
        back = vm.empty([3])
        p.call_into("copy", [s], [back], stream=d2h)
    np.testing.assert_array_equal(back.numpy(), np.maximum(a, 0).sum(axis=0))
    with pytest.raises(RuntimeError, match="closed"):
        p.call("relu", [dev], stream=compute)


def test_program_errors(vm):
    compute = vm.stream("mock:0", "compute")
    x = vm.array(np.ones(3, np.float32))
    with vm.program() as p:
        with pytest.raises(eagervm.WrongDeviceError):
            p.call("relu", [x], stream=compute)
        with pytest.raises(eagervm.AccessError, match="only host tensors"):
            p.write(vm.empty([3], device="mock:0"), np.ones(3, np.float32))
        with pytest.raises(eagervm.DTypeError):
            p.write(vm.empty([3]), np.ones(3, np.int64))
        with pytest.raises(eagervm.InvalidOperandsError, match="call_multi"):
            p.call("noop", [x], stream=vm.stream())
        with pytest.raises(ValueError, match="another VM"):
            p.call("relu", [x], stream=eagervm.VM().stream())


def test_program_and_eager_calls_keep_their_order(vm, device):
    s = vm.stream(device)
    x = vm.array(np.full(4, 3.0, np.float32), device)
    with vm.program() as p:
        y = p.call("scale", [x], stream=s, scalar=2.0)
        z = y + x  # an eager call on the program's output, inside the block
        w = p.call("relu", [z], stream=s)
    np.testing.assert_array_equal(w.numpy(), [9.0] * 4)


def test_record_replay_validate_analyze(vm, tmp_path):
    path = tmp_path / "p.trace"
    rec = vm.record(path)
    x = vm.array(np.array([1.0, -2.0, 3.0], np.float32), "mock:0")
    y = (x.relu() * 2.0).sum().to("cpu:0")
    summary = rec.finish([y])
    assert summary["expects"] == 1 and summary["instructions"] > 0 and summary["failure"] is None
    assert eagervm.validate(path)["instructions"] == summary["instructions"]
    r = eagervm.replay(path)
    assert r["checked"] == 1 and r["failures"] == [] and r["instructions"] == summary["instructions"]
    r = eagervm.replay(path, device="cpu", resync=True)
    assert r["checked"] == 1
    a = eagervm.analyze(path)
    assert a["critical_path"] >= 1 and a["dot"].startswith("digraph")
    with pytest.raises(RuntimeError, match="finished"):
        rec.finish()


def test_trace_errors(tmp_path):
    bad = tmp_path / "bad.trace"
    bad.write_text("eagervm-trace 1\nnonsense here\n")
    with pytest.raises(eagervm.TraceError, match="bad.trace:2"):
        eagervm.validate(bad)
    with pytest.raises(eagervm.TraceError):
        eagervm.replay(tmp_path / "missing.trace")
    with pytest.raises(ValueError, match="unknown device"):
        eagervm.replay(bad, device="tpu")


def test_shipped_traces_replay():
    r = eagervm.replay(ROOT / "instructions" / "mlp.trace")
    assert r["checked"] == 64 and r["instructions"] == 2888
    r = eagervm.replay(ROOT / "instructions" / "failure.trace")
    assert r["expected_failure"] and r["failures"]


def test_timelines(vm, tmp_path):
    vm.start_profiling()
    assert vm.is_profiling
    x = vm.array(np.ones((32, 32), np.float32), "mock:0")
    (x @ x).relu().sum().item()
    prof = vm.stop_profiling()
    assert prof.instructions > 0 and prof.span > 0
    assert any(b["stream"] == "mock:0:compute" and b["instructions"] > 0 for b in prof.busy())
    out = tmp_path / "t.json"
    prof.write_timeline(out)
    events = json.loads(out.read_text())
    assert events  # Chrome trace-event JSON
    with pytest.raises(eagervm.ProfileError, match="no profiling session"):
        vm.stop_profiling()
    r = eagervm.replay(ROOT / "instructions" / "pipeline.trace", timeline=tmp_path / "r.json")
    assert r["profile"].instructions > 0 and (tmp_path / "r.json").stat().st_size > 0


def test_example_mlp_trains(device):
    mlp = runpy.run_path(str(ROOT / "examples" / "python" / "mlp.py"))
    losses = mlp["train"](eagervm.VM(mock_devices=1), device=device)
    assert len(losses) == 60 and losses[-1] < 0.5 * losses[0]


def test_example_streams_matches_numpy():
    streams = runpy.run_path(str(ROOT / "examples" / "python" / "streams.py"))
    results, reference = streams["run"](eagervm.VM(mock_devices=1), chunks=4)
    for r, e in zip(results, reference):
        np.testing.assert_allclose(r, e, rtol=1e-4, atol=1e-4)


def test_example_linear_regression_fits_the_line(vm, device):
    example = runpy.run_path(str(ROOT / "examples" / "python" / "linear_regression.py"))
    with vm:  # the example names no VM: it runs on the default one
        w, b, loss = example["fit"](device=device)
    assert abs(w - 3) < 1e-3 and abs(b + 1) < 1e-3 and loss < 1e-6


@pytest.mark.parametrize("script", ["mlp.py", "streams.py", "linear_regression.py"])
def test_examples_run_as_scripts(script):
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "python" / script)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
