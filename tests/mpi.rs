//! Multi-process tests of the MPI backend (cargo feature `mpi`): every collective, checked on
//! every rank against values computed locally from the known inputs of all ranks, and a dead
//! rank whose peers fail with a typed error instead of hanging.
//!
//! One binary, three ways to run it:
//! - `cargo test --features mpi --test mpi` (no launcher): a driver that starts `mpirun` on
//!   this same binary for each case (collectives on 2 and 4 ranks, a dead rank among 3),
//!   each with a time limit, and checks what the ranks report. Names given on the command
//!   line (`collectives-2`, `collectives-4`, `dead-rank`) run only those cases.
//! - `mpirun -np N <binary>`: every rank runs the collective checks.
//! - `<binary> --rank <case>` under `mpirun`: every rank runs that case (what the driver
//!   launches).
//!
//! Each rank prints `ok rank R of N: ...` (or `survived rank R of N: ...`) when its checks
//! pass; a failed check panics, which ends the rank with a non-zero status and makes
//! `mpirun` fail.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use eagervm::ep::ccl::mpi::MpiBackend;
use eagervm::ep::ccl::{
    Backend, Buf, BufMut, Call, CclError, Collective, DeviceSpan, Part, ReduceOp, ScalarType,
};
use eagervm::ep::DeviceId;
use eagervm::framework::{Communicator, Tensor};
use eagervm::vm::Config;
use eagervm::{Error, VirtualMachine};

const CPU: DeviceId = DeviceId::CPU;

/// The engine's watchdog timeout in the dead-rank case.
const WATCHDOG: Duration = Duration::from_secs(2);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--rank") {
        let case = args.get(i + 1).map(String::as_str).unwrap_or("collectives");
        rank_main(case);
    } else if launched() {
        rank_main("collectives");
    } else {
        driver(&args);
    }
}

/// Whether an MPI launcher started this process (OpenMPI, PMIx or Hydra variables).
fn launched() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"].iter().any(|v| std::env::var_os(v).is_some())
}

fn rank_main(case: &str) {
    let backend = MpiBackend::world().expect("MPI starts");
    match case {
        "collectives" => collectives(backend),
        "dead-rank" => dead_rank(backend),
        other => panic!("unknown case {other}"),
    }
}

/// Rank `r`'s `len` floats: small integers, so that every sum is exact in any order.
fn floats(r: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| ((r * 7 + i * 3) % 11) as f32 - 5.0).collect()
}

/// Rank `r`'s `len` integers, beyond `f32`'s exact range.
fn ints(r: usize, len: usize) -> Vec<i64> {
    (0..len).map(|i| (r as i64 - 1) * (1 << 40) + if r % 2 == 0 { i as i64 } else { -(i as i64) }).collect()
}

/// The reduction of every rank's `x(r)`, in rank order.
fn reduce_f32(n: usize, op: ReduceOp, x: impl Fn(usize) -> Vec<f32>) -> Vec<f32> {
    let mut acc = x(0);
    for r in 1..n {
        for (a, b) in acc.iter_mut().zip(x(r)) {
            *a = match op {
                ReduceOp::Sum | ReduceOp::Mean => *a + b,
                ReduceOp::Max => a.max(b),
                ReduceOp::Min => a.min(b),
            };
        }
    }
    if op == ReduceOp::Mean {
        acc.iter_mut().for_each(|a| *a /= n as f32);
    }
    acc
}

fn reduce_i64(n: usize, op: ReduceOp, x: impl Fn(usize) -> Vec<i64>) -> Vec<i64> {
    let mut acc = x(0);
    for r in 1..n {
        for (a, b) in acc.iter_mut().zip(x(r)) {
            *a = match op {
                ReduceOp::Sum | ReduceOp::Mean => *a + b,
                ReduceOp::Max => (*a).max(b),
                ReduceOp::Min => (*a).min(b),
            };
        }
    }
    acc
}

fn one(vm: &VirtualMachine, comm: &Communicator, c: Collective, x: &[&Tensor]) -> Tensor {
    let mut outs = vm.run(|b| b.collective(comm, c, x)).expect("the collective is issued");
    assert_eq!(outs.len(), 1);
    outs.pop().unwrap()
}

fn collectives(backend: MpiBackend) {
    let (r, n) = (backend.rank(), backend.world_size());
    assert!(r < n);
    assert_eq!(backend.kind(), "mpi");
    assert_eq!(backend.members().len(), 1);
    assert_eq!(backend.members()[0].device, CPU);
    assert_eq!(backend.members()[0].rank, r);

    // A device buffer is refused before MPI sees it.
    let call = Call { op: Collective::AllReduce(ReduceOp::Sum), dtype: ScalarType::F32, count: 2, seq: 0 };
    let mut out = [0u8; 8];
    let mut parts = [Part {
        device: CPU,
        send: Buf::Device(
            // SAFETY: never dereferenced: the MPI backend refuses device buffers before it
            // reads a byte, which is what this checks.
            unsafe { DeviceSpan::new(0x1000, 8) },
        ),
        recv: BufMut::Host(&mut out),
    }];
    assert!(matches!(backend.run(&call, &mut parts), Err(CclError::Invalid(_))));

    let vm = VirtualMachine::new(Config::default()).expect("vm starts");
    let comm = vm.communicator("world", Arc::new(backend)).expect("communicator");
    assert_eq!(comm.backend(), "mpi");
    assert_eq!(comm.world_size(), n);
    let mut done = Vec::new();

    // all_reduce of floats, each reduction.
    const LEN: usize = 10;
    let x = vm.from_slice(&floats(r, LEN), &[LEN], CPU).unwrap();
    for op in ReduceOp::ALL {
        let y = one(&vm, &comm, Collective::AllReduce(op), &[&x]);
        assert_eq!(y.to_vec::<f32>().unwrap(), reduce_f32(n, op, |q| floats(q, LEN)), "all_reduce {op:?}");
        done.push(format!("all_reduce.{}", op.name()));
    }
    // ... and of integers.
    let xi = vm.from_slice(&ints(r, LEN), &[LEN], CPU).unwrap();
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
        let y = one(&vm, &comm, Collective::AllReduce(op), &[&xi]);
        assert_eq!(y.to_vec::<i64>().unwrap(), reduce_i64(n, op, |q| ints(q, LEN)), "all_reduce {op:?} i64");
    }
    done.push("all_reduce i64".into());

    // broadcast from every root.
    for root in 0..n {
        let y = one(&vm, &comm, Collective::Broadcast { root }, &[&x]);
        assert_eq!(y.to_vec::<f32>().unwrap(), floats(root, LEN), "broadcast from {root}");
    }
    done.push("broadcast".into());

    // all_gather: every rank's input, in rank order, along the first dimension.
    let x2 = vm.from_slice(&floats(r, 6), &[3, 2], CPU).unwrap();
    let y = one(&vm, &comm, Collective::AllGather, &[&x2]);
    assert_eq!(y.shape(), [3 * n, 2]);
    assert_eq!(y.to_vec::<f32>().unwrap(), (0..n).flat_map(|q| floats(q, 6)).collect::<Vec<_>>());
    done.push("all_gather".into());

    // reduce_scatter: slice r of the reduction.
    let xs = vm.from_slice(&floats(r, 3 * n), &[3 * n], CPU).unwrap();
    for op in ReduceOp::ALL {
        let y = one(&vm, &comm, Collective::ReduceScatter(op), &[&xs]);
        let full = reduce_f32(n, op, |q| floats(q, 3 * n));
        assert_eq!(y.to_vec::<f32>().unwrap(), full[3 * r..3 * r + 3], "reduce_scatter {op:?}");
    }
    done.push("reduce_scatter".into());

    // barrier: a token holding the number of ranks.
    let t = vm.run(|b| b.barrier(&comm)).unwrap();
    assert_eq!(t[0].to_vec::<i64>().unwrap(), [n as i64]);
    done.push("barrier".into());

    // A large all_reduce (4 MiB), and a run of small ones issued together, in order.
    let big: Vec<f32> = (0..1 << 20).map(|i| (i % 13) as f32 + r as f32).collect();
    let xb = vm.from_slice(&big, &[big.len()], CPU).unwrap();
    let y = one(&vm, &comm, Collective::AllReduce(ReduceOp::Sum), &[&xb]);
    let want: Vec<f32> = (0..1 << 20).map(|i| (n * (i % 13) + n * (n - 1) / 2) as f32).collect();
    assert!(y.to_vec::<f32>().unwrap() == want, "large all_reduce");
    let chain = vm
        .run(|b| -> eagervm::Result<Vec<Tensor>> {
            let mut out = Vec::new();
            let mut y = x.clone();
            for _ in 0..50 {
                y = b.all_reduce(&comm, &[&y], ReduceOp::Max)?.pop().unwrap();
                out.push(y.clone());
            }
            Ok(out)
        })
        .unwrap();
    let top = reduce_f32(n, ReduceOp::Max, |q| floats(q, LEN));
    for y in &chain {
        assert_eq!(y.to_vec::<f32>().unwrap(), top);
    }
    done.push("4 MiB all_reduce, 50 chained".into());
    vm.sync().unwrap();

    // Aborting an idle communicator: its next collective fails at once, with the reason,
    // and the VM goes on.
    comm.abort("test: aborted on purpose");
    let t0 = Instant::now();
    let y = one(&vm, &comm, Collective::AllReduce(ReduceOp::Sum), &[&x]);
    match y.to_vec::<f32>() {
        Err(Error::Kernel { message, .. }) => assert!(message.contains("aborted on purpose"), "{message}"),
        other => panic!("expected a kernel error, got {other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(1));
    assert!(vm.sync().is_err());
    assert_eq!(vm.from_slice(&[1.0f32], &[1], CPU).unwrap().to_vec::<f32>().unwrap(), [1.0]);
    done.push("abort".into());
    drop(vm);
    println!("ok rank {r} of {n}: {}", done.join(", "));
}

/// The last rank dies after one collective; the others issue the next one, which waits for
/// it, until the engine's watchdog (a 2 s timeout) aborts the communicator and writes its
/// flight record.
fn dead_rank(backend: MpiBackend) {
    let (r, n) = (backend.rank(), backend.world_size());
    assert!(n >= 2, "the dead-rank case needs 2 ranks or more");
    let dump = std::env::temp_dir().join(format!("eagervm-mpi-flight-{}.txt", std::process::id()));
    let _ = std::fs::remove_file(&dump);
    let config =
        Config { watchdog_timeout: Some(WATCHDOG), flight_dump: Some(dump.clone()), ..Config::default() };
    let vm = VirtualMachine::new(config).expect("vm starts");
    let comm = vm.communicator("world", Arc::new(backend)).expect("communicator");
    let x = vm.from_slice(&floats(r, 4), &[4], CPU).unwrap();
    let y = one(&vm, &comm, Collective::AllReduce(ReduceOp::Sum), &[&x]);
    assert_eq!(y.to_vec::<f32>().unwrap(), reduce_f32(n, ReduceOp::Sum, |q| floats(q, 4)));
    if r == n - 1 {
        println!("dying rank {r} of {n}");
        std::io::stdout().flush().unwrap();
        // SAFETY: `_exit` ends the process at once, running no handler: as a crash would.
        unsafe { libc::_exit(3) };
    }
    let t0 = Instant::now();
    let y = one(&vm, &comm, Collective::AllReduce(ReduceOp::Sum), &[&x]);
    let message = match y.to_vec::<f32>() {
        Err(Error::Kernel { message, .. }) => message,
        other => panic!("rank {r}: expected a kernel error, got {other:?}"),
    };
    let waited = t0.elapsed();
    assert!(message.contains("aborted") && message.contains("watchdog"), "{message}");
    assert!(waited >= WATCHDOG - Duration::from_millis(50), "failed before the abort: {waited:?}");
    // The watchdog wakes every quarter of its timeout, so it fires up to a quarter late.
    assert!(waited < WATCHDOG * 2 + Duration::from_secs(2), "the abort took {waited:?} to be seen");
    let record = std::fs::read_to_string(&dump).expect("the watchdog wrote its flight record");
    assert!(
        record.starts_with("eagervm flight record v1") && record.contains("all_reduce.sum@world"),
        "{record}"
    );
    let _ = std::fs::remove_file(&dump);
    // Every later collective fails at once; the VM lives on.
    let t1 = Instant::now();
    let z = vm.run(|b| b.barrier(&comm)).unwrap();
    assert!(matches!(z[0].to_vec::<i64>(), Err(Error::Kernel { .. })));
    assert!(t1.elapsed() < Duration::from_secs(1));
    assert!(matches!(vm.sync(), Err(Error::Failed { .. })));
    assert_eq!(vm.from_slice(&[2.0f32], &[1], CPU).unwrap().to_vec::<f32>().unwrap(), [2.0]);
    drop(vm);
    println!("survived rank {r} of {n}: failed after {} ms: {message}", waited.as_millis());
}

/// The options every launch needs here: root in containers, more ranks than cores.
fn mpirun() -> Command {
    let mut c = Command::new("mpirun");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        c.arg("--allow-run-as-root");
    }
    c.arg("--oversubscribe");
    c
}

struct Outcome {
    ok: bool,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

/// Run `cmd` with its output in files, killing it after `limit`.
fn run_limited(mut cmd: Command, name: &str, limit: Duration) -> Outcome {
    let dir = std::env::temp_dir();
    let (out, err) = (
        dir.join(format!("eagervm-mpi-{}-{name}.out", std::process::id())),
        dir.join(format!("eagervm-mpi-{}-{name}.err", std::process::id())),
    );
    cmd.stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap());
    let t0 = Instant::now();
    let mut child = cmd.spawn().expect("mpirun starts (is OpenMPI installed?)");
    let ok = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.success();
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            eprintln!("{name}: killed after {limit:?}");
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let read = |p: &std::path::Path| {
        let s = std::fs::read_to_string(p).unwrap_or_default();
        let _ = std::fs::remove_file(p);
        s
    };
    Outcome { ok, stdout: read(&out), stderr: read(&err), elapsed: t0.elapsed() }
}

fn driver(args: &[String]) {
    let exe = std::env::current_exe().expect("the test binary's path");
    let wanted = |name: &str| {
        let names: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
        names.is_empty() || names.iter().any(|a| name.contains(a.as_str()))
    };
    let mut failed = Vec::new();
    for n in [2, 4] {
        let name = format!("collectives-{n}");
        if !wanted(&name) {
            continue;
        }
        let mut cmd = mpirun();
        cmd.args(["-np", &n.to_string()]).arg(&exe).args(["--rank", "collectives"]);
        let o = run_limited(cmd, &name, Duration::from_secs(120));
        let oks = o.stdout.lines().filter(|l| l.starts_with("ok rank")).count();
        let pass = o.ok && oks == n;
        println!("{name}: {} ({} of {n} ranks ok, {:.1} s)", verdict(pass), oks, o.elapsed.as_secs_f64());
        if !pass {
            println!("--- stdout\n{}--- stderr\n{}", o.stdout, o.stderr);
            failed.push(name);
        }
    }
    if wanted("dead-rank") {
        let n = 3;
        let mut cmd = mpirun();
        // OpenMPI's launcher ends the whole job when a rank exits with a non-zero status;
        // told not to, it lets the survivors run on, to fail by themselves. Shared memory
        // only (`self,vader`): a transport that sees the peer's socket close (TCP) may end
        // the process itself, whatever the error handler says.
        cmd.args(["--mca", "orte_abort_on_non_zero_status", "0", "--mca", "btl", "self,vader"]);
        cmd.args(["-np", &n.to_string()]).arg(&exe).args(["--rank", "dead-rank"]);
        let o = run_limited(cmd, "dead-rank", Duration::from_secs(60));
        let survived: Vec<&str> = o.stdout.lines().filter(|l| l.starts_with("survived rank")).collect();
        let dying = o.stdout.lines().filter(|l| l.starts_with("dying rank")).count();
        // mpirun reports the dead rank (a non-zero status): the verdict is the survivors'.
        let pass = survived.len() == n - 1 && dying == 1 && o.elapsed < Duration::from_secs(60);
        println!(
            "dead-rank: {} ({} of {} survivors failed cleanly, {:.1} s, mpirun {})",
            verdict(pass),
            survived.len(),
            n - 1,
            o.elapsed.as_secs_f64(),
            if o.ok { "succeeded" } else { "reported the dead rank" }
        );
        for l in &survived {
            println!("  {l}");
        }
        if !pass {
            println!("--- stdout\n{}--- stderr\n{}", o.stdout, o.stderr);
            failed.push("dead-rank".to_string());
        }
    }
    if !failed.is_empty() {
        eprintln!("failed: {}", failed.join(", "));
        std::process::exit(1);
    }
}

fn verdict(pass: bool) -> &'static str {
    if pass {
        "ok"
    } else {
        "FAILED"
    }
}
