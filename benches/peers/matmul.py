"""PyTorch's CPU matmul, timed the way benches/kernels.rs times eagervm's, so that the two
can be compared in one run.

    python benches/peers/matmul.py --size 512 --threads 1 --reps 20
        prints one JSON line: {"size": 512, "threads": 1, "median_s": ..., "min_s": ...,
        "times_s": [...], "torch": version}

    python benches/peers/matmul.py --serve
        reads lines "SIZE THREADS REPS" on stdin and answers each with such a JSON line;
        benches/kernels.rs runs it so (EAGERVM_PEER_PYTHON=/path/to/python) and interleaves
        its rounds with its own.

Each timed call is one torch.matmul of two float32 [SIZE, SIZE] tensors into a
preallocated output (out=), after two untimed calls, with torch.set_num_threads(THREADS).
"""

import argparse
import json
import statistics
import sys
import time

import torch


def measure(size: int, threads: int, reps: int) -> dict:
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(size)
    a = torch.rand((size, size), generator=g, dtype=torch.float32) * 2 - 1
    b = torch.rand((size, size), generator=g, dtype=torch.float32) * 2 - 1
    out = torch.empty((size, size), dtype=torch.float32)
    for _ in range(2):
        torch.matmul(a, b, out=out)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.matmul(a, b, out=out)
        times.append(time.perf_counter() - t0)
    return {
        "size": size,
        "threads": threads,
        "median_s": statistics.median(times),
        "min_s": min(times),
        "times_s": times,
        "torch": torch.__version__,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=512)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--serve", action="store_true", help="answer 'SIZE THREADS REPS' lines on stdin")
    args = p.parse_args()
    if not args.serve:
        print(json.dumps(measure(args.size, args.threads, args.reps)))
        return
    for line in sys.stdin:
        parts = line.split()
        if not parts:
            continue
        size, threads, reps = (int(x) for x in parts)
        print(json.dumps(measure(size, threads, reps)), flush=True)


if __name__ == "__main__":
    main()
