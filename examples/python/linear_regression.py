"""A PyTorch program that runs on eagervm by changing its import: a line fitted by
gradient descent, with PyTorch's tensor API (creation, views, broadcasting, matmul,
in-place updates, reads). With `import torch` in place of the import below, it runs on
PyTorch unchanged.

    python examples/python/linear_regression.py [--steps 300] [--device mock:0]

(`mock:0` needs a VM with a mock device: `EAGERVM_MOCK_DEVICES=1`.)
"""

import argparse

import eagervm as torch


def fit(steps=300, lr=0.5, device="cpu"):
    """Fit y = 3 x - 1 on 32 points of [0, 1); returns (w, b, final loss)."""
    x = torch.arange(0, 32, device=device).float().reshape(-1, 1) / 32  # [32, 1]
    y = 3 * x - 1
    w = torch.zeros(1, 1, device=device)
    b = torch.zeros(1, device=device)
    n = x.shape[0]
    for _ in range(steps):
        err = x @ w + b - y  # [32, 1]; b broadcasts over the rows
        grad_w = x.T @ err * (2 / n)  # [1, 1], x.T a view
        grad_b = err.sum() * (2 / n)  # 0-d
        w -= lr * grad_w  # in place
        b -= lr * grad_b
    err = x @ w + b - y
    loss = (err * err).sum() / n
    return w.item(), b[0].item(), float(loss)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    w, b, loss = fit(args.steps, device=args.device)
    print(f"w = {w:.4f}, b = {b:.4f}, loss = {loss:.2e}")
    ok = abs(w - 3) < 1e-2 and abs(b + 1) < 1e-2
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
