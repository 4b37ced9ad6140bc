#!/usr/bin/env python3
"""compare.py's --busy path, against stand-ins for eagervm and the ATen harness (no PyTorch,
no build): each level runs both sides beside that many busy loops, the table shows each
side's slowdown, and no busy loop outlives compare.py.

    python3 benches/peers/test_compare.py      # also run by .ci/run
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare  # noqa: E402

# Stands in for `eagervm bench --json`: per workload a figure of 100 * (1 + busy), so that
# eagervm's slowdown at k is 1 + k, and the fields `--busy` adds.
FAKE_EAGERVM = """
import json, sys
a = sys.argv[1:]
busy = int(a[a.index("--busy") + 1]) if "--busy" in a else 0
f = 100.0 * (1 + busy)
extra = {"busy": busy, "load_1m_start": 0.5, "load_1m_end": 0.75}
for w in a[a.index("-w") + 1].split(","):
    if w == "6-9":
        for n in ("W6", "W7", "W8", "W9"):
            print(json.dumps({"workload": n, "ns_per_op": f, "checked": True, **extra}))
    else:
        hidden = 32 if w == "mlp" else 1024
        shape = {"samples": 64 if w == "mlp" else 1024, "inputs": 8 if w == "mlp" else 1024, "hidden": hidden}
        print(json.dumps({"workload": "mlp", "shape": shape, "step_us": f, "step_us_loss_read": f, **extra}))
"""

# Stands in for the ATen harness: counts the busy loops its parent (compare.py) runs beside it,
# records their ids in $BUSY_PIDS_FILE, and reports figures of 1000 * (1 + count / 2).
FAKE_ATEN = """
import json, os, sys
parent, found = os.getppid(), []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().split(b"\\0")[:-1]
    except (OSError, IndexError, ValueError):
        continue
    if ppid == parent and cmd == [b"sh", b"-c", b"while :; do :; done"]:
        found.append(int(pid))
with open(os.environ["BUSY_PIDS_FILE"], "a") as f:
    f.write(json.dumps(found) + "\\n")
t = 1000.0 * (1 + len(found) / 2)
for shape in ("64x8x32", "1024x1024x1024"):
    print(json.dumps({"work": "mlp", "shape": shape, "mode": "eager", "us_per_step": t, "us_per_step_loss_read": t}))
print(json.dumps({"work": "chain", "mode": "out of place", "ns_per_op": t}))
print(json.dumps({"work": "chain", "mode": "in place", "ns_per_op": t}))
print(json.dumps({"work": "round trip", "ns_per_op": t}))
"""


def script(folder, name, body):
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(f"#!{sys.executable}\n" + textwrap.dedent(body))
    os.chmod(path, 0o755)
    return path


def alive(pid):
    """Whether `pid` is still a busy loop (a reused id would run something else)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().startswith(b"sh\0-c\0while")
    except OSError:
        return False


class BusyLevels(unittest.TestCase):
    def test_each_side_runs_beside_k_loops_and_none_outlives_the_run(self):
        with tempfile.TemporaryDirectory() as d:
            pids_file = os.path.join(d, "pids")
            env = dict(os.environ, BUSY_PIDS_FILE=pids_file)
            p = subprocess.run(
                [sys.executable, os.path.join(HERE, "compare.py"), "--eagervm", script(d, "eagervm", FAKE_EAGERVM),
                 "--aten", script(d, "aten", FAKE_ATEN), "--busy", "2,0", "--rounds", "2", "--reps", "1",
                 "-n", "1000", "--json-out", os.path.join(d, "runs.json")],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(pids_file) as f:
                seen = [json.loads(line) for line in f]
            # Two rounds, levels in order 0 then 2: the harness ran beside 0, 2, 0, 2 loops.
            self.assertEqual([len(s) for s in seen], [0, 2, 0, 2], p.stderr)
            for pid in sum(seen, []):
                self.assertFalse(alive(pid), f"busy loop {pid} outlived compare.py")
            with open(os.path.join(d, "runs.json")) as f:
                rounds = json.load(f)
            self.assertEqual(len(rounds), 2)
            self.assertEqual(sorted(rounds[0]), ["0", "2"])
        out = p.stdout
        self.assertIn("k = 0: 1-minute load average 0.50-0.75 (eagervm), ", out)
        level2 = out[out.index("k = 2"):]
        w8 = next(line for line in level2.splitlines() if line.strip().startswith("W8"))
        # eagervm 300 ns against ATen's 2000: 0.15; slowdowns 3 and 2 against k = 0.
        self.assertIn("0.150 (0.150-0.150)", w8)
        self.assertIn("x3.00 vs x2.00", w8)
        level0 = out[out.index("k = 0"):out.index("k = 2")]
        self.assertIn("x1.00 vs x1.00", level0)

    def test_levels_parse_sorted_and_once(self):
        self.assertEqual(compare.parse_levels("2,0,1,2"), [0, 1, 2])
        for bad in ("", "-1", "a", "1,x", "2000"):
            with self.assertRaises(Exception, msg=bad):
                compare.parse_levels(bad)

    def test_competitors_stop_when_the_block_raises(self):
        with self.assertRaises(RuntimeError):
            with compare.Competitors(2) as c:
                pids = c.pids()
                # Each becomes the shell once its fork has exec'd: wait for that.
                deadline = time.monotonic() + 10
                while not all(alive(p) for p in pids) and time.monotonic() < deadline:
                    time.sleep(0.01)
                self.assertTrue(all(alive(p) for p in pids))
                raise RuntimeError("a harness failed")
        self.assertEqual(len(pids), 2)
        self.assertFalse(any(alive(p) for p in pids))


if __name__ == "__main__":
    unittest.main()
