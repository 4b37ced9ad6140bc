"""A framework author's program with explicit streams: chunks copied to a device on its
host-to-device stream, computed on its compute stream, copied back on its device-to-host
stream, so that copies overlap compute. Writes a Perfetto timeline of the run.

    python examples/python/streams.py [--chunks 16] [--timeline streams.json]

The VM inserts the cross-stream synchronisation itself (soft sync: a RecordEvent on the
producing stream and a StreamWaitEvent on the consuming one), so the program only says
which stream runs what.
"""

import argparse

import numpy as np

import eagervm


def run(vm, chunks=16, n=64, device="mock:0", timeline=None):
    """Run the pipeline on `vm`; returns the per-chunk results (host numpy arrays) and the
    reference computed by NumPy."""
    h2d = vm.stream(device, "h2d")
    compute = vm.stream(device, "compute")
    d2h = vm.stream(device, "d2h")
    rng = np.random.default_rng(7)
    w_host = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    data = [rng.uniform(-1, 1, (n, n)).astype(np.float32) for _ in range(chunks)]

    if timeline:
        vm.start_profiling()
    w = vm.array(w_host, device=device)
    outs = []
    with vm.program() as p:
        for chunk in data:
            host = vm.empty([n, n])
            p.write(host, chunk)  # a host write
            x = vm.empty([n, n], device=device)
            p.call_into("copy", [host], [x], stream=h2d)  # upload
            y = p.call("matmul", [x, w], stream=compute)
            y = p.call("relu", [y], stream=compute)
            s = p.call("sum_rows", [y], stream=compute)
            back = vm.empty([n])
            p.call_into("copy", [s], [back], stream=d2h)  # download
            outs.append(back)
    results = [o.numpy() for o in outs]
    if timeline:
        prof = vm.stop_profiling()
        prof.write_timeline(timeline)
        print(prof.summary())
    reference = [np.maximum(c @ w_host, 0).sum(axis=0) for c in data]
    return results, reference


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--timeline", default=None, help="write a Perfetto timeline here")
    args = ap.parse_args()
    vm = eagervm.VM(mock_devices=1)
    results, reference = run(vm, chunks=args.chunks, timeline=args.timeline)
    worst = max(float(np.max(np.abs(r - e))) for r, e in zip(results, reference))
    print(f"{len(results)} chunks through h2d -> compute -> d2h; largest difference from NumPy: {worst:.2e}")
    if args.timeline:
        print(f"timeline written to {args.timeline} (open it in ui.perfetto.dev)")
    return 0 if worst < 1e-3 else 1


if __name__ == "__main__":
    raise SystemExit(main())
