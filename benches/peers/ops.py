"""eagervm's ops against PyTorch's on the CPU, in one run, with ratios; and the large
elementwise ops and reductions against the machine's memory bandwidth (a NumPy copy, in
the same run).

    python benches/peers/ops.py                      # every case, 5 interleaved rounds
    python benches/peers/ops.py --rounds 3 --only softmax,layer_norm --json-out ops.json

Needs a Python with both ``torch`` and ``eagervm`` (build the package into the peers venv:
``PATH=$VENV/bin:$PATH $VENV/bin/python -m pip install --no-build-isolation .``).
Both sides use the same number of threads (``--threads``, default 1: eagervm's
``EAGERVM_KERNEL_THREADS`` and ``torch.set_num_threads``).

Each case times ``reps`` calls of the op on the same inputs, then a wait for the results
(``vm.sync()``; PyTorch's CPU ops return finished), so eagervm's time includes issuing,
scheduling, allocating and running each op. Rounds alternate eagervm and PyTorch, and the
median of the rounds is reported. For a memory-bound case the bytes each call moves
(inputs read plus the output written) over its time is its bandwidth, printed beside the
copy's (``numpy.copyto`` of 64 MiB, read and written, timed in the same round).
``ratio`` is PyTorch's time over eagervm's: above 1, eagervm is faster.
"""

import argparse
import json
import os
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--only", default="", help="comma-separated case names (default: all)")
    p.add_argument("--json-out", default="", help="also write the results as JSON here")
    return p.parse_args()


ARGS = parse_args()
os.environ["EAGERVM_KERNEL_THREADS"] = str(ARGS.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as TF  # noqa: E402

import eagervm  # noqa: E402
import eagervm.nn.functional as EF  # noqa: E402

torch.set_num_threads(ARGS.threads)
VM = eagervm.default_vm()


def timed(fn, reps, sync):
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t0) / reps


def both(arrays):
    """The same random float32 inputs for both sides."""
    rng = np.random.default_rng(0)
    out = []
    for spec in arrays:
        if spec[0] == "f32":
            a = rng.standard_normal(spec[1]).astype(np.float32)
        else:  # ("i64", shape, high)
            a = rng.integers(0, spec[2], size=spec[1]).astype(np.int64)
        out.append((eagervm.tensor(a), torch.from_numpy(a.copy())))
    return [x[0] for x in out], [x[1] for x in out]


MB = 1 << 20


def cases():
    """(name, inputs, eagervm fn, torch fn, bytes moved per call or None, reps)."""
    big = [("f32", (4096, 4096))]  # 64 MiB
    two = [("f32", (4096, 4096)), ("f32", (4096, 4096))]
    rows = [("f32", (4096, 1024))]
    ce = [("f32", (4096, 1000)), ("i64", (4096,), 1000)]
    b = 4 * 4096 * 4096
    return [
        ("add", two, lambda x, y: x + y, lambda x, y: x + y, 3 * b, 5),
        ("exp", big, lambda x: x.exp(), lambda x: x.exp(), 2 * b, 5),
        ("exp (transposed view)", big, lambda x: x.t().exp(), lambda x: x.t().exp(), 2 * b, 5),
        ("sum(dim=1)", big, lambda x: x.sum(dim=1), lambda x: x.sum(dim=1), b, 5),
        ("sum(dim=0)", big, lambda x: x.sum(dim=0), lambda x: x.sum(dim=0), b, 5),
        ("amax(dim=1)", big, lambda x: x.amax(dim=1), lambda x: x.amax(dim=1), b, 5),
        ("amax(dim=0)", big, lambda x: x.amax(dim=0), lambda x: x.amax(dim=0), b, 5),
        ("mean(dim=0)", big, lambda x: x.mean(dim=0), lambda x: x.mean(dim=0), b, 5),
        ("argmax(dim=1)", big, lambda x: x.argmax(dim=1), lambda x: x.argmax(dim=1), b, 5),
        ("softmax", rows, lambda x: EF.softmax(x, dim=-1), lambda x: TF.softmax(x, dim=-1), None, 10),
        ("log_softmax", rows, lambda x: EF.log_softmax(x, dim=-1), lambda x: TF.log_softmax(x, dim=-1), None, 10),
        (
            "layer_norm",
            rows + [("f32", (1024,)), ("f32", (1024,))],
            lambda x, w, c: EF.layer_norm(x, (1024,), w, c),
            lambda x, w, c: TF.layer_norm(x, (1024,), w, c),
            None,
            10,
        ),
        ("cross_entropy", ce, lambda x, t: EF.cross_entropy(x, t), lambda x, t: TF.cross_entropy(x, t), None, 10),
        (
            "conv2d LeNet 1->6 5x5 [64,1,32,32]",
            [("f32", (64, 1, 32, 32)), ("f32", (6, 1, 5, 5))],
            lambda x, w: EF.conv2d(x, w),
            lambda x, w: TF.conv2d(x, w),
            None,
            10,
        ),
        (
            "conv2d LeNet 6->16 5x5 [64,6,14,14]",
            [("f32", (64, 6, 14, 14)), ("f32", (16, 6, 5, 5))],
            lambda x, w: EF.conv2d(x, w),
            lambda x, w: TF.conv2d(x, w),
            None,
            10,
        ),
        (
            "conv2d ResNet 64->64 3x3 pad 1 [8,64,56,56]",
            [("f32", (8, 64, 56, 56)), ("f32", (64, 64, 3, 3))],
            lambda x, w: EF.conv2d(x, w, padding=1),
            lambda x, w: TF.conv2d(x, w, padding=1),
            None,
            3,
        ),
        (
            "bmm [64,128,128]",
            [("f32", (64, 128, 128)), ("f32", (64, 128, 128))],
            lambda a, c: a.bmm(c),
            lambda a, c: a.bmm(c),
            None,
            10,
        ),
        (
            "bmm attention [32,256,64]x[32,64,256]",
            [("f32", (32, 256, 64)), ("f32", (32, 64, 256))],
            lambda a, c: a.bmm(c),
            lambda a, c: a.bmm(c),
            None,
            10,
        ),
    ]


def main():
    only = {s.strip() for s in ARGS.only.split(",") if s.strip()}
    src = np.random.default_rng(1).standard_normal(16 * MB).astype(np.float32)
    dst = np.empty_like(src)
    load = os.getloadavg()[0]
    results = []
    for name, specs, ef, tf, nbytes, reps in cases():
        if only and name.split(" ")[0] not in only and name not in only:
            continue
        ein, tin = both(specs)
        try:
            for _ in range(2):
                ef(*ein)
                tf(*tin)
            VM.sync()
        except Exception as e:  # an op eagervm lacks: reported, the others still run
            print(f"{name:44s} eagervm failed: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        et, tt, ct = [], [], []
        for _ in range(ARGS.rounds):
            ct.append(timed(lambda: np.copyto(dst, src), 3, lambda: None))
            et.append(timed(lambda: ef(*ein), reps, VM.sync))
            tt.append(timed(lambda: tf(*tin), reps, lambda: None))
        e, t, c = statistics.median(et), statistics.median(tt), statistics.median(ct)
        row = {"case": name, "eagervm_s": e, "torch_s": t, "ratio": t / e}
        copy_gbs = 2 * src.nbytes / c / 1e9
        if nbytes:
            row.update(eagervm_gbs=nbytes / e / 1e9, torch_gbs=nbytes / t / 1e9, copy_gbs=copy_gbs)
            row["of_copy"] = row["eagervm_gbs"] / copy_gbs
        results.append(row)
        extra = ""
        if nbytes:
            extra = (
                f"  {row['eagervm_gbs']:6.2f} GB/s ({row['of_copy']:.2f} of copy {copy_gbs:.2f}), "
                f"torch {row['torch_gbs']:6.2f}"
            )
        print(f"{name:44s} eagervm {e * 1e3:9.3f} ms  torch {t * 1e3:9.3f} ms  ratio {t / e:5.2f}{extra}")
        sys.stdout.flush()
    end_load = os.getloadavg()[0]
    print(f"threads {ARGS.threads}, rounds {ARGS.rounds}, load average {load:.2f} at the start, {end_load:.2f} at the end")
    if ARGS.json_out:
        with open(ARGS.json_out, "w") as f:
            json.dump(
                {"threads": ARGS.threads, "rounds": ARGS.rounds, "load_start": load, "load_end": end_load, "results": results},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
