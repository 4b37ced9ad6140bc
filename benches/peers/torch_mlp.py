#!/usr/bin/env python3
"""PyTorch's side of `benches/peers/run.sh`: the work `eagervm bench` measures, in PyTorch.

- mlp: the training step of `eagervm run mlp` (src/programs/mlp.rs, src/bench/mlp.rs): the
  same 24 ops with the same hand-written backward pass (no autograd), at 64x8x32 and
  1024x1024x1024, timed per step with the loss read only at the end, and read every step
  (`loss.item()`);
- chain: 10^5 tiny adds `x = x + 1` on a one-element tensor, then one sync (eagervm's W8),
  and the in-place form `x.add_(1)`;
- round trip: one add, then `item()` (eagervm's W9).

With `--device cuda` the same on cuda:0, and with `--graphs` the MLP step also captured
once in a CUDA graph and replayed. Each figure is the median of `--reps` repetitions, one
JSON object per line on standard output:

    {"peer": "torch-python", "work": "mlp", "shape": "64x8x32", "device": "cpu",
     "mode": "eager", "us_per_step": ..., "us_per_step_loss_read": ..., ...}
"""

import argparse
import json
import statistics
import time

import torch

SHAPES = {"small": (64, 8, 32), "large": (1024, 1024, 1024)}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def model(shape, device):
    """Data and weights of the shape (uniform, as the program's; values do not change the
    time of these kernels)."""
    n, d, h = shape
    g = torch.Generator().manual_seed(1)
    u = lambda *s, scale=1.0: ((torch.rand(*s, generator=g) * 2 - 1) * scale).to(device)
    x, y = u(n, d), u(n, 1)
    w1, w2 = u(d, h, scale=(3.0 / d) ** 0.5), u(h, 1, scale=(3.0 / h) ** 0.5)
    b1, b2 = torch.zeros(h, device=device), torch.zeros(1, device=device)
    return [x, y, w1, b1, w2, b2]


def step(state, lr=0.05):
    """One step of `programs::mlp`, op for op: returns the loss (on the device), updates the
    weights out of place as the program does."""
    x, y, w1, b1, w2, b2 = state
    inv_n = 1.0 / x.shape[0]
    z = torch.matmul(x, w1) + b1
    a = torch.relu(z)
    p = torch.matmul(a, w2) + b2
    diff = p - y
    loss = (diff * diff).sum() * inv_n  # read by item(), which waits for it
    dp = diff * (2.0 * inv_n)
    dw2 = torch.matmul(a.t(), dp)
    db2 = dp.sum(0)
    dz = torch.where(z > 0, torch.matmul(dp, w2.t()), 0.0)
    dw1 = torch.matmul(x.t(), dz)
    db1 = dz.sum(0)
    state[2] = w1 - dw1 * lr
    state[3] = b1 - db1 * lr
    state[4] = w2 - dw2 * lr
    state[5] = b2 - db2 * lr
    return loss


def time_steps(shape, device, steps, read_each):
    state = model(shape, device)
    sync(device)
    t0 = time.perf_counter()
    loss = step(state)
    for _ in range(1, steps):
        if read_each:
            loss.item()
        loss = step(state)
    sync(device)
    loss.item()
    return (time.perf_counter() - t0) * 1e6 / steps


def time_graph(shape, device, steps, read_each):
    """The step captured once in a CUDA graph (static tensors, in-place updates), replayed."""
    state = model(shape, device)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm up the kernels before capture, as the docs require
            graph_step(state)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = graph_step(state)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        graph.replay()
        if read_each:
            loss.item()
    sync(device)
    loss.item()
    return (time.perf_counter() - t0) * 1e6 / steps


def graph_step(state, lr=0.05):
    """`step` with the updates in place (a graph replays into the same memory); the loss
    stays on the device."""
    x, y, w1, b1, w2, b2 = state
    inv_n = 1.0 / x.shape[0]
    z = torch.matmul(x, w1) + b1
    a = torch.relu(z)
    p = torch.matmul(a, w2) + b2
    diff = p - y
    loss = (diff * diff).sum() * inv_n
    dp = diff * (2.0 * inv_n)
    dw2 = torch.matmul(a.t(), dp)
    db2 = dp.sum(0)
    dz = torch.where(z > 0, torch.matmul(dp, w2.t()), 0.0)
    dw1 = torch.matmul(x.t(), dz)
    db1 = dz.sum(0)
    w1.sub_(dw1 * lr)
    b1.sub_(db1 * lr)
    w2.sub_(dw2 * lr)
    b2.sub_(db2 * lr)
    return loss


def chain(device, n, in_place):
    x = torch.zeros(1, device=device)
    sync(device)
    t0 = time.perf_counter()
    if in_place:
        for _ in range(n):
            x.add_(1.0)
    else:
        for _ in range(n):
            x = x + 1.0
    sync(device)
    got = x.item()
    ns = (time.perf_counter() - t0) * 1e9 / n
    assert got == float(min(n, 1 << 24)), got
    return ns


def round_trip(device, n):
    x = torch.zeros(1, device=device)
    sync(device)
    t0 = time.perf_counter()
    for i in range(n):
        x = x + 1.0
        assert x.item() == float(i + 1)
    return (time.perf_counter() - t0) * 1e9 / n


def median_of(reps, f):
    vals = [f() for _ in range(reps)]
    return statistics.median(vals), [min(vals), max(vals)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda (cuda:0)")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads on the CPU (default 1)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2000, help="MLP steps at the small shape")
    ap.add_argument("--large-steps", type=int, default=10, help="MLP steps at 1024x1024x1024")
    ap.add_argument("--chain", type=int, default=100_000, help="adds in the chain")
    ap.add_argument("--round-trips", type=int, default=10_000)
    ap.add_argument("--graphs", action="store_true", help="with cuda: also the MLP step in a CUDA graph")
    ap.add_argument("--only", default="mlp,chain,round-trip", help="comma-separated: mlp,chain,round-trip")
    args = ap.parse_args()
    if args.reps < 1 or args.steps < 1 or args.large_steps < 1 or args.chain < 1 or args.round_trips < 1:
        ap.error("--reps, --steps, --large-steps, --chain and --round-trips must be at least 1")
    device = torch.device("cuda:0" if args.device.startswith("cuda") else "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"peer": "torch-python", "skipped": "torch.cuda.is_available() is false"}))
        return
    if args.graphs and device.type != "cuda":
        ap.error("--graphs needs --device cuda")
    torch.set_num_threads(args.threads)
    only = set(args.only.split(","))
    base = {"peer": "torch-python", "torch": torch.__version__, "device": str(device), "threads": torch.get_num_threads()}
    emit = lambda **kw: print(json.dumps({**base, **kw}), flush=True)

    if "mlp" in only:
        for name, shape in SHAPES.items():
            steps = args.steps if name == "small" else args.large_steps
            label = "x".join(map(str, shape))
            modes = [("eager", time_steps)] + ([("cuda-graph", time_graph)] if args.graphs else [])
            for mode, f in modes:
                f(shape, device, max(2, steps // 10), False)  # warm-up
                plain, plain_range = median_of(args.reps, lambda: f(shape, device, steps, False))
                read, _ = median_of(args.reps, lambda: f(shape, device, steps, True))
                emit(work="mlp", shape=label, mode=mode, steps=steps, us_per_step=plain,
                     us_per_step_loss_read=read, us_range=plain_range)
    if "chain" in only:
        for in_place in (False, True):
            chain(device, max(1, args.chain // 10), in_place)
            ns, rng = median_of(args.reps, lambda: chain(device, args.chain, in_place))
            emit(work="chain", mode="in place" if in_place else "x = x + 1", ops=args.chain, ns_per_op=ns, ns_range=rng)
    if "round-trip" in only:
        round_trip(device, max(1, args.round_trips // 10))
        ns, rng = median_of(args.reps, lambda: round_trip(device, args.round_trips))
        emit(work="round trip", ops=args.round_trips, ns_per_op=ns, ns_range=rng)


if __name__ == "__main__":
    main()
