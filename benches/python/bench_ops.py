"""The binding's cost per call, in one run (docs/performance.md, "From Python").

    python benches/python/bench_ops.py [--n 100000] [--reps 3]

1. A Python loop of n tiny ops (`x = x + y` on 16-element float32 arrays, then one wait):
   eagervm on cpu:0 and mock:0, the same loop in NumPy, and in PyTorch CPU eager if it is
   importable; then on cpu:0 an op with a number (`x = x * 1.0`) and a view (`v = x[1:]`,
   no kernel: the binding's and the view's own cost), in each library that has it. Per op,
   median of the repetitions.
2. The MLP training step (64 x 8 -> 32 -> 1, about 25 calls) from Python
   (examples/python/mlp.py), against the same program in Rust (src/programs/mlp.rs, run by
   the command line, `eagervm run mlp`, whose time includes a timeline it takes; set
   EAGERVM_BIN or build it with `cargo build --release`), and against the program's
   recorded instruction stream replayed by the Rust crate (instructions/mlp.trace).
3. The round trip: issue one add on a one-element array, then read the result
   (`x = x + y; x.item()`, as a loop that reads its loss each step), eagervm on cpu:0 and
   PyTorch CPU eager if it is importable; the median trip of 2000, median of the
   repetitions.
4. DLPack exchange with NumPy, per call, for a 4 KiB and a 64 MiB float32 array on cpu:0:
   export as a view of the VM's storage (`numpy.from_dlpack(y)`) against a copy
   (`numpy.from_dlpack(y, copy=True)`), and import of the producer's memory
   (`vm.from_dlpack(a)`) against a copy (`copy=True`); each import is waited for
   (`wait()`), each exported view dropped. Median of the repetitions.
"""

import argparse
import os
import pathlib
import re
import subprocess
import runpy
import statistics
import time

import numpy as np

import eagervm

ROOT = pathlib.Path(__file__).resolve().parents[2]


def median_time(f, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def chain_eagervm(vm, device, n):
    y = vm.array(np.ones(16, np.float32), device)

    def run():
        x = y
        for _ in range(n):
            x = x + y
        x.wait()

    return run


def scalar_chain(y, n):
    def run():
        x = y
        for _ in range(n):
            x = x * 1.0
        if hasattr(x, "wait"):
            x.wait()

    return run


def view_loop(y, n):
    def run():
        for _ in range(n):
            y[1:]

    return run


def chain_numpy(n):
    y = np.ones(16, np.float32)

    def run():
        x = y
        for _ in range(n):
            x = x + y

    return run


def chain_torch(torch, n):
    y = torch.ones(16)

    def run():
        x = y
        for _ in range(n):
            x = x + y

    return run


def round_trip(add, one, zero, reps, trips=2000):
    """Median seconds of one `x = add(x, one); x.item()`, median over `reps` rounds."""
    medians = []
    x = zero
    for _ in range(200):
        x = add(x, one)
        x.item()
    for _ in range(reps):
        times = []
        for _ in range(trips):
            t0 = time.perf_counter()
            x = add(x, one)
            x.item()
            times.append(time.perf_counter() - t0)
        medians.append(statistics.median(times))
    return statistics.median(medians)


def per_call(f, k, reps):
    """Seconds per call of `f`, `k` calls a repetition, median of `reps`."""

    def run():
        for _ in range(k):
            f()

    run()
    return median_time(run, reps) / k


def dlpack_rows(vm, reps):
    """(size, what, zero-copy seconds, copy seconds) per call."""
    rows = []
    for label, n, k in [("4 KiB", 1 << 10, 2000), ("64 MiB", 1 << 24, 5)]:
        a = np.arange(n, dtype=np.float32)
        y = vm.array(a) * 1.0
        y.wait()
        rows.append(
            (
                label,
                "export (numpy.from_dlpack)",
                per_call(lambda: np.from_dlpack(y), k, reps),
                per_call(lambda: np.from_dlpack(y, copy=True), k, reps),
            )
        )
        rows.append(
            (
                label,
                "import (vm.from_dlpack)",
                per_call(lambda: vm.from_dlpack(a).wait(), k, reps),
                per_call(lambda: vm.from_dlpack(a, copy=True).wait(), k, reps),
            )
        )
    return rows


def rust_mlp_step(reps):
    """Seconds per step of `eagervm run mlp` (60 steps), median of `reps`, or None."""
    target = os.environ.get("CARGO_TARGET_DIR", str(ROOT / "target"))
    exe = os.environ.get("EAGERVM_BIN", os.path.join(target, "release", "eagervm"))
    if not os.path.exists(exe):
        return None
    times = []
    for _ in range(reps + 1):
        out = subprocess.run([exe, "run", "mlp"], capture_output=True, text=True, check=True).stdout
        m = re.search(r"ran `mlp` in ([0-9.]+)(ms|µs|s)", out)
        scale = {"ms": 1e-3, "µs": 1e-6, "s": 1.0}[m.group(2)]
        times.append(float(m.group(1)) * scale / 60)
    return statistics.median(times[1:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    n, reps = args.n, args.reps

    vm = eagervm.VM(mock_devices=1)
    # (library, op, seconds per op or None); each is warmed up (thread pools, caches), then timed.
    rows = []
    for lib, f in [
        ("eagervm cpu:0", chain_eagervm(vm, "cpu:0", n)),
        ("eagervm mock:0", chain_eagervm(vm, "mock:0", n)),
        ("numpy", chain_numpy(n)),
    ]:
        f()
        rows.append((lib, "x + y", median_time(f, reps) / n))
    try:
        import torch

        torch.set_num_threads(1)
        f = chain_torch(torch, n)
        f()
        rows.append((f"torch {torch.__version__} cpu", "x + y", median_time(f, reps) / n))
    except ImportError:
        rows.append(("torch cpu", "x + y", None))

    y16 = vm.array(np.ones(16, np.float32))
    for what, make in [("x * 1.0", scalar_chain), ("x[1:]", view_loop)]:
        for lib, y in [("eagervm cpu:0", y16), ("numpy", np.ones(16, np.float32))]:
            f = make(y, n)
            try:
                f()
            except (TypeError, eagervm.Error):
                rows.append((lib, what, None))
                continue
            rows.append((lib, what, median_time(f, reps) / n))

    numpy_cost = {op: t for lib, op, t in rows if lib == "numpy"}
    print(f"tiny-op loop: n = {n}, median of {reps}")
    print(f"{'':<20} {'op':<8} {'ns/op':>9} {'vs numpy':>9}")
    for lib, op, t in rows:
        if t is None:
            print(f"{lib:<20} {op:<8} {'(not installed or not supported)':>34}")
        else:
            print(f"{lib:<20} {op:<8} {t * 1e9:>9.0f} {t / numpy_cost[op]:>9.2f}")

    add = lambda a, b: a + b  # noqa: E731
    trip = round_trip(add, vm.array(np.ones(1, np.float32)), vm.array(np.zeros(1, np.float32)), reps)
    try:
        import torch

        torch_trip = round_trip(add, torch.ones(1), torch.zeros(1), reps)
    except ImportError:
        torch_trip = None
    print(f"round trip (x = x + one; x.item()), median trip, median of {reps}:")
    print(f"  eagervm cpu:0   {trip * 1e6:8.2f} us")
    if torch_trip is None:
        print("  torch cpu       (not installed)")
    else:
        print(f"  torch cpu       {torch_trip * 1e6:8.2f} us   eagervm / torch {trip / torch_trip:.2f}")

    mlp = runpy.run_path(str(ROOT / "examples" / "python" / "mlp.py"))
    steps = args.steps
    train = lambda: mlp["train"](vm, device="cpu:0", steps=steps)  # noqa: E731
    train()
    py_step = median_time(train, reps) / steps
    trace = ROOT / "instructions" / "mlp.trace"
    eagervm.replay(trace)
    walls = [eagervm.replay(trace)["wall"] for _ in range(reps)]
    rust_step = statistics.median(walls) / 60
    print(f"MLP step (cpu:0), median of {reps}:")
    print(f"  python (examples/python/mlp.py)  {py_step * 1e6:8.1f} us")
    cli = rust_mlp_step(reps)
    if cli is None:
        print("  rust (eagervm run mlp)           not built (cargo build --release, or set EAGERVM_BIN)")
    else:
        print(f"  rust (eagervm run mlp)           {cli * 1e6:8.1f} us   python / rust {py_step / cli:.2f}")
    print(f"  rust (replay of mlp.trace)       {rust_step * 1e6:8.1f} us   python / replay {py_step / rust_step:.2f}")

    print(f"DLPack with NumPy (cpu:0), per call, median of {reps}:")
    print(f"  {'':<8} {'':<28} {'zero-copy':>11} {'copy':>11} {'copy / zero-copy':>17}")
    for size, what, view, copy in dlpack_rows(vm, reps):
        print(f"  {size:<8} {what:<28} {view * 1e6:>9.1f}us {copy * 1e6:>9.1f}us {copy / view:>17.1f}")


if __name__ == "__main__":
    main()
