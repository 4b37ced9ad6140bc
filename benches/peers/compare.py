#!/usr/bin/env python3
"""Run eagervm and its peers in the same run and print the ratios (called by run.sh).

Each round runs, one after the other: `eagervm bench --json`, the ATen harness, the PyTorch
Python harness and MXNet's engine harness (those given). A ratio is taken within each round
(its figures come from the same minutes of a noisy machine), and the table shows the median
over rounds with the lowest and highest round. Times: lower is better; "eagervm / peer"
below 1 means eagervm is faster.

With --busy K1,K2,...: the CPU figures with a PyTorch figure beside them (the MLP step, the
add chains W6-W8, the round trip W9) against the ATen harness, each round running every level
in turn with that many busy loops beside each side (`eagervm bench --busy K`, and the same
loops started here around the ATen harness), with each side's slowdown against the lowest
level of the same round and the load average observed.

With --cuda: `eagervm bench --cuda --json` (the `run mlp` step on cuda:0) against PyTorch on
the same GPU, eager and with CUDA graphs.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys

# The competitors' program: the busy loop `eagervm bench --busy` starts (src/bench/busy.rs,
# BUSY_LOOP), so that both sides of a ratio run beside the same kind of competition. `:` is a
# shell builtin: the loop makes no system call and never sleeps.
BUSY_LOOP = ["sh", "-c", "while :; do :; done"]

# What eagervm runs under --busy: the workloads that have a PyTorch figure beside them.
CONTENTION_WORKLOADS = "6-9,mlp,mlp-large"


class Competitors:
    """`k` busy loops, started on entering the block and killed and reaped on leaving it,
    however it ends (an exception, sys.exit, SIGTERM turned into SystemExit by main)."""

    def __init__(self, k):
        self.k, self.procs = k, []

    def __enter__(self):
        try:
            for _ in range(self.k):
                self.procs.append(subprocess.Popen(BUSY_LOOP, stdin=subprocess.DEVNULL,
                                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def pids(self):
        return [p.pid for p in self.procs]

    def stop(self):
        # Every kill first, then every wait: they stop together, and none is left a zombie.
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()
        self.procs = []


def load_1m():
    """The 1-minute load average, or None where the system does not tell."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def parse_levels(text):
    """`--busy`'s value: comma-separated counts of busy loops, 0 or more, each once, in order."""
    try:
        levels = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"`{text}`: a comma-separated list of counts, e.g. 0,1,2")
    if not levels or levels[0] < 0 or levels[-1] > 1024:
        raise argparse.ArgumentTypeError(f"`{text}`: counts from 0 to 1024, e.g. 0,1,2")
    return levels


def run(cmd):
    """Run `cmd`, return its standard output's JSON lines; stderr passes through."""
    print("  $ " + " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"compare.py: `{' '.join(cmd)}` failed with status {p.returncode}")
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


def run_text(cmd):
    print("  $ " + " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"compare.py: `{' '.join(cmd)}` failed with status {p.returncode}")
    return p.stdout


def eagervm_cpu(args, workloads="all", busy=None):
    """Figures of one eagervm run, by name: times in µs or ns, rates in instr/s; and its JSON
    lines (`busy`, `load_1m_start`, `load_1m_end` in each)."""
    cmd = [args.eagervm, "bench", "-n", str(args.n), "-r", str(args.reps), "-w", workloads, "--json"]
    if busy is not None:
        cmd += ["--busy", str(busy)]
    out = {}
    rows = run(cmd)
    for r in rows:
        w = r["workload"]
        if w in ("W1", "W2", "W3", "W4"):
            out[f"{w} instr/s"] = r["e2e_instr_per_s"]
            out[f"{w} of floor"] = r["of_floor"]
        elif w == "mlp":
            label = "x".join(str(r["shape"][k]) for k in ("samples", "inputs", "hidden"))
            out[f"mlp {label}"] = r["step_us"]
            out[f"mlp {label} loss read"] = r["step_us_loss_read"]
        else:
            if not r["checked"]:
                sys.exit(f"compare.py: eagervm's {w} differed from its sequential reference")
            out[w] = r["ns_per_op"]
    return out, rows


def torch_figures(rows):
    out = {}
    for r in rows:
        if "skipped" in r:
            continue
        if r["work"] == "mlp":
            key = f"mlp {r['shape']}" + (" graph" if r["mode"] == "cuda-graph" else "")
            out[key] = r["us_per_step"]
            out[key + " loss read"] = r["us_per_step_loss_read"]
        elif r["work"] == "chain":
            out["chain in place" if r["mode"] == "in place" else "chain"] = r["ns_per_op"]
        else:
            out["round trip"] = r["ns_per_op"]
    return out


def mxnet_figures(args):
    out = {}
    text = run_text([args.mxnet, "-n", str(args.n), "-r", str(args.reps)])
    for line in text.splitlines():
        if line.startswith("RESULT"):
            kv = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
            out[f"{kv['workload']} instr/s"] = float(kv["e2e_ops_per_s"])
    return out


def aten_cmd(args):
    return [args.aten, "--reps", str(args.reps), "--steps", str(max(2, args.n // 500)),
            "--large-steps", str(max(2, args.n // 100_000))]


def torch_cmd(args, device):
    cmd = [args.torch_python, args.torch_script, "--reps", str(args.reps), "--device", device]
    if device == "cuda":
        cmd += ["--graphs", "--steps", str(args.cuda_steps), "--large-steps", str(args.cuda_steps)]
    else:
        cmd += ["--threads", "1", "--steps", str(max(2, args.n // 500)), "--large-steps", str(max(2, args.n // 100_000))]
    return cmd


def summary(rows, title):
    """rows: (label, what eagervm's figure measures, [per-round eagervm figure], {peer: [per-round figure]},
    [(peer, goal text, per-round ratio fn)]."""
    print(f"\n{title}")
    fmt = lambda v: "-" if v is None else (f"{v:,.1f}" if v < 1e5 else f"{v:,.3g}")
    for label, unit, ours, peers, ratios in rows:
        med = lambda xs: statistics.median(xs) if xs else None
        line = f"  {label:<34} eagervm {fmt(med(ours)):>10} {unit:<8}"
        for peer, vals in peers.items():
            line += f"  {peer} {fmt(med(vals)):>10}"
        print(line)
        for name, goal, values in ratios:
            if not values:
                continue
            print(f"      {name:<40} {statistics.median(values):7.3f}  (rounds {min(values):.3f}-{max(values):.3f})  {goal}")


def cpu(args):
    rounds = []
    for i in range(args.rounds):
        print(f"round {i + 1}/{args.rounds}", file=sys.stderr, flush=True)
        r = {"eagervm": eagervm_cpu(args)[0]}
        if args.aten:
            r["aten"] = torch_figures(run(aten_cmd(args)))
        if args.torch_python:
            r["python"] = torch_figures(run(torch_cmd(args, "cpu")))
        if args.mxnet:
            r["mxnet"] = mxnet_figures(args)
        rounds.append(r)

    def col(peer, key):
        return [r[peer][key] for r in rounds if peer in r and key in r[peer]]

    def ratio(a, ka, b, kb, invert=False):
        out = []
        for r in rounds:
            if a in r and b in r and ka in r[a] and kb in r[b]:
                x, y = r[a][ka], r[b][kb]
                out.append(y / x if invert else x / y)
        return out

    rows = []
    for shape, goals in (("64x8x32", (0.8, 0.5)), ("1024x1024x1024", (1.2, 1.2))):
        for suffix in ("", " loss read"):
            key = f"mlp {shape}{suffix}"
            rows.append((f"MLP step {shape}{suffix}", "us", col("eagervm", key),
                         {"ATen(1t)": col("aten", key), "Python(1t)": col("python", key)},
                         [("eagervm / ATen", f"goal <= {goals[0]}" if not suffix else "", ratio("eagervm", key, "aten", key)),
                          ("eagervm / Python", f"goal <= {goals[1]}" if not suffix else "", ratio("eagervm", key, "python", key))]))
    for ours, what in (("W6", "add chain, call_into"), ("W7", "add chain, call"), ("W8", "add chain, eager")):
        rows.append((f"{what} ({ours})", "ns/op", col("eagervm", ours),
                     {"ATen": col("aten", "chain"), "ATen in place": col("aten", "chain in place"), "Python": col("python", "chain")},
                     [("eagervm / ATen x = x + 1", "", ratio("eagervm", ours, "aten", "chain")),
                      ("eagervm / Python x = x + 1", "", ratio("eagervm", ours, "python", "chain"))]))
    rows.append(("round trip (W9; goal <= 2,000 ns)", "ns", col("eagervm", "W9"),
                 {"ATen": col("aten", "round trip"), "Python": col("python", "round trip")},
                 [("eagervm / ATen", "", ratio("eagervm", "W9", "aten", "round trip")),
                  ("eagervm / Python", "", ratio("eagervm", "W9", "python", "round trip"))]))
    rows.append(("DAG across streams (W5)", "ns/op", col("eagervm", "W5"), {}, []))
    for w in ("W1", "W2", "W3", "W4"):
        key = f"{w} instr/s"
        rows.append((f"{w} no-ops", "instr/s", col("eagervm", key), {"MXNet": col("mxnet", key)},
                     [("eagervm / MXNet (throughput)", "goal >= 20", ratio("eagervm", key, "mxnet", key)),
                      ("eagervm / floor (throughput)", "goal >= 0.65", col("eagervm", f"{w} of floor"))]))
    summary(rows, f"eagervm against PyTorch {args.torch_version} and MXNet on the CPU, {args.rounds} round(s), "
                  f"medians (each figure itself a median of {args.reps})")
    return rounds


def contention(args):
    """Every level of --busy in each round, eagervm and the ATen harness each beside that many
    busy loops; per level the figures, the ratios and each side's slowdown."""
    levels = args.busy
    if args.torch_python or args.mxnet:
        print("compare.py: --busy compares eagervm with the ATen harness only; PyTorch from Python "
              "and MXNet are not run", file=sys.stderr)
    if not args.aten:
        print("compare.py: no ATen harness (--aten): eagervm's figures and slowdowns only", file=sys.stderr)
    rounds = []
    for i in range(args.rounds):
        r = {}
        for k in levels:
            print(f"round {i + 1}/{args.rounds}: {k} busy loop(s) beside each side", file=sys.stderr, flush=True)
            ours, rows = eagervm_cpu(args, CONTENTION_WORKLOADS, busy=k)
            if any(row.get("busy") != k for row in rows):
                sys.exit(f"compare.py: eagervm bench --busy {k} reported other counts: {[row.get('busy') for row in rows]}")
            level = {"eagervm": ours,
                     "load": {"eagervm": [x for row in rows for x in (row.get("load_1m_start"), row.get("load_1m_end"))
                                          if x is not None]}}
            if args.aten:
                before = load_1m()
                with Competitors(k):
                    level["aten"] = torch_figures(run(aten_cmd(args)))
                    # Read while they still run: the load the harness ran under.
                    after = load_1m()
                level["load"]["aten"] = [x for x in (before, after) if x is not None]
            r[k] = level
        rounds.append(r)
    print_contention(args, rounds)
    return rounds


# The contention table's rows: (label, unit, eagervm's figure, ATen's figure).
CONTENTION_ROWS = (
    ("MLP step 64x8x32", "us", "mlp 64x8x32", "mlp 64x8x32"),
    ("MLP step 1024x1024x1024", "us", "mlp 1024x1024x1024", "mlp 1024x1024x1024"),
    ("W6 call_into vs chain x = x + 1", "ns/op", "W6", "chain"),
    ("W7 call vs chain", "ns/op", "W7", "chain"),
    ("W8 eager add vs chain", "ns/op", "W8", "chain"),
    ("W9 round trip vs round trip", "ns", "W9", "round trip"),
)


def print_contention(args, rounds):
    levels = args.busy
    base = levels[0]
    med = lambda xs: statistics.median(xs) if xs else None
    fmt = lambda v: "-" if v is None else (f"{v:,.1f}" if v < 1e5 else f"{v:,.3g}")
    times = lambda v: "-" if v is None else f"x{v:.2f}"

    def figures(side, key, k):
        return [r[k][side][key] for r in rounds if side in r[k] and key in r[k][side]]

    def per_round(fn):
        out = []
        for r in rounds:
            try:
                out.append(fn(r))
            except (KeyError, ZeroDivisionError):
                pass
        return out

    print(f"\neagervm against PyTorch {args.torch_version} (ATen, 1 thread) beside k busy loops "
          f"(`{BUSY_LOOP[0]} {BUSY_LOOP[1]} '{BUSY_LOOP[2]}'`), {args.rounds} round(s) of every level, "
          f"medians (each figure itself a median of {args.reps}); {os.cpu_count()} CPUs")
    for k in levels:
        loads = {name: [x for r in rounds for x in r[k]["load"].get(side, [])]
                 for side, name in (("eagervm", "eagervm"), ("aten", "ATen"))}
        load = ", ".join(f"{min(v):.2f}-{max(v):.2f} ({name})" for name, v in loads.items() if v) or "unknown"
        print(f"\nk = {k}: 1-minute load average {load}")
        print(f"  {'figure':<34} {'eagervm':>11} {'ATen':>11} {'unit':<6} {'eagervm/ATen (rounds)':<24} "
              f"slowdown against k = {base}: eagervm vs ATen")
        for label, unit, ours, theirs in CONTENTION_ROWS:
            ratios = per_round(lambda r: r[k]["eagervm"][ours] / r[k]["aten"][theirs])
            ratio = "-" if not ratios else f"{med(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
            slow_ours = med(per_round(lambda r: r[k]["eagervm"][ours] / r[base]["eagervm"][ours]))
            slow_theirs = med(per_round(lambda r: r[k]["aten"][theirs] / r[base]["aten"][theirs]))
            print(f"  {label:<34} {fmt(med(figures('eagervm', ours, k))):>11} {fmt(med(figures('aten', theirs, k))):>11} "
                  f"{unit:<6} {ratio:<24} {times(slow_ours)} vs {times(slow_theirs)}")
    print(f"\neagervm/ATen below 1: eagervm is faster. Slowdown: the figure at k over the same figure at "
          f"k = {base} in the same round (median over rounds); a side whose slowdown is larger loses more to "
          f"the busy loops.")


def cuda(args):
    rounds = []
    for i in range(args.rounds):
        print(f"round {i + 1}/{args.rounds}", file=sys.stderr, flush=True)
        ours = run([args.eagervm, "bench", "--cuda", "--json", "-r", "1", "--chain", "0", "--chunks", "0",
                    "--steps", str(args.cuda_steps)])
        if not ours or ours[0].get("skipped"):
            sys.exit(f"compare.py: eagervm bench --cuda skipped: {ours[0].get('skipped') if ours else 'no output'}")
        r = {"eagervm": {}}
        for m in ours[0]["mlp_steps"]:
            label = "x".join(str(m["shape"][k]) for k in ("samples", "inputs", "hidden"))
            r["eagervm"][f"mlp {label}"] = m["step_us"]
            r["eagervm"][f"mlp {label} loss read"] = m["step_us_loss_read"]
        rows = run(torch_cmd(args, "cuda") + ["--only", "mlp"])
        if rows and "skipped" in rows[0]:
            sys.exit(f"compare.py: PyTorch: {rows[0]['skipped']}")
        r["torch"] = torch_figures(rows)
        rounds.append(r)

    def col(peer, key):
        return [r[peer][key] for r in rounds if key in r[peer]]

    def speedup(key, peer_key):
        return [r["torch"][peer_key] / r["eagervm"][key] for r in rounds if key in r["eagervm"] and peer_key in r["torch"]]

    rows = []
    for shape in ("64x8x32", "1024x1024x1024"):
        for suffix in ("", " loss read"):
            key = f"mlp {shape}{suffix}"
            graph = f"mlp {shape} graph{suffix}"
            goal = "goal >= 2" if shape == "64x8x32" and not suffix else ""
            rows.append((f"MLP step {shape}{suffix}", "us", col("eagervm", key),
                         {"torch eager": col("torch", key), "torch graph": col("torch", graph)},
                         [("speed-up over torch eager", goal, speedup(key, key)),
                          ("speed-up over torch CUDA graph", "", speedup(key, graph))]))
    summary(rows, f"eagervm against PyTorch {args.torch_version} on cuda:0, {args.rounds} round(s), medians")
    return rounds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--eagervm", required=True, help="the eagervm binary")
    ap.add_argument("--aten", help="the ATen harness (build_aten.sh)")
    ap.add_argument("--torch-python", help="python with torch installed")
    ap.add_argument("--torch-script", default=__file__.replace("compare.py", "torch_mlp.py"))
    ap.add_argument("--mxnet", help="MXNet's engine harness (shared/baselines/mxnet-engine)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-n", type=int, default=1_000_000, help="eagervm bench -n (and MXNet's; the peers scale as it does)")
    ap.add_argument("--cuda", action="store_true")
    ap.add_argument("--cuda-steps", type=int, default=200)
    ap.add_argument("--json-out", help="write every round's figures here")
    ap.add_argument("--busy", type=parse_levels, default=[0], metavar="K1,K2,...",
                    help="levels of competition: per round, each level in turn with that many busy loops beside "
                         "eagervm and the ATen harness (default 0: none, and the full comparison)")
    args = ap.parse_args()
    if args.rounds < 1 or args.reps < 1 or args.n < 1:
        ap.error("--rounds, --reps and -n must be at least 1")
    if args.cuda and args.busy != [0]:
        ap.error("--busy applies to the CPU comparison, not --cuda")
    # A SIGTERM unwinds like sys.exit, so that running busy loops are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    args.torch_version = "?"
    if args.torch_python:
        args.torch_version = run_text([args.torch_python, "-c", "import torch; print(torch.__version__)"]).strip()
    if args.cuda:
        rounds = cuda(args)
    elif args.busy != [0]:
        rounds = contention(args)
    else:
        rounds = cpu(args)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rounds, f, indent=1)


if __name__ == "__main__":
    main()
