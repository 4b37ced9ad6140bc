"""Train a two-layer MLP with eagervm from Python: the `mlp` program of the Rust crate
(src/programs/mlp.rs), written with eagervm arrays.

    python examples/python/mlp.py [--device mock:0] [--steps 60]

Model p = relu(x W1 + b1) W2 + b2, loss mean((p - y)^2), hand-written backward pass and
SGD. Every op returns at once; the losses are read once training is done, so the whole
run is queued without a single wait until then.
"""

import argparse

import numpy as np

import eagervm


def dataset(rng, samples, inputs):
    coef = rng.uniform(-1.0, 1.0, inputs).astype(np.float32)
    x = rng.uniform(-1.0, 1.0, (samples, inputs)).astype(np.float32)
    y = (x @ coef + x[:, 0] * x[:, 1]).astype(np.float32).reshape(samples, 1)
    return x, y


def train(vm, device="cpu:0", steps=60, samples=64, inputs=8, hidden=32, lr=0.05, seed=1):
    """Train on `vm`; returns the loss before each step's update (a list of floats)."""
    rng = np.random.default_rng(seed)
    xv, yv = dataset(rng, samples, inputs)
    w1v = rng.uniform(-1, 1, (inputs, hidden)).astype(np.float32) * np.float32(np.sqrt(3 / inputs))
    w2v = rng.uniform(-1, 1, (hidden, 1)).astype(np.float32) * np.float32(np.sqrt(3 / hidden))

    x, y = vm.array(xv, device), vm.array(yv, device)
    w1, w2 = vm.array(w1v, device), vm.array(w2v, device)
    b1, b2 = vm.zeros([hidden], device=device), vm.zeros([1], device=device)
    inv_n = 1.0 / samples

    losses = []
    for _ in range(steps):
        # Forward.
        z = (x @ w1).add_bias(b1)
        a = z.relu()
        p = (a @ w2).add_bias(b2)
        diff = p - y
        losses.append((diff * diff).sum().scale(inv_n).to("cpu:0"))
        # Backward.
        dp = diff * (2.0 * inv_n)
        dw2 = a.matmul_tn(dp)
        db2 = dp.sum_rows()
        dz = z.relu_grad(dp.matmul_nt(w2))
        dw1 = x.matmul_tn(dz)
        db1 = dz.sum_rows()
        # SGD.
        w1 = w1 - dw1 * lr
        b1 = b1 - db1 * lr
        w2 = w2 - dw2 * lr
        b2 = b2 - db2 * lr
    return [l.item() for l in losses]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu:0")
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    vm = eagervm.VM(mock_devices=1 if args.device.startswith("mock") else None)
    losses = train(vm, device=args.device, steps=args.steps)
    every = max(1, len(losses) // 10)
    for i, l in enumerate(losses):
        if i % every == 0 or i + 1 == len(losses):
            print(f"step {i + 1:>4}  loss {l:.6f}")
    fell = losses[-1] < 0.5 * losses[0]
    print(f"loss {losses[0]:.6f} -> {losses[-1]:.6f} ({'fell by more than half' if fell else 'did NOT halve'})")
    return 0 if fell else 1


if __name__ == "__main__":
    raise SystemExit(main())
