//! The rendezvous: a small TCP key-value store, and the torchrun-style environment that says
//! where it is.
//!
//! A launcher such as `torchrun` starts one process per rank and gives each the variables
//! `WORLD_SIZE`, `RANK`, `LOCAL_RANK`, `MASTER_ADDR` and `MASTER_PORT`
//! ([`Rendezvous::from_env`]). Rank 0 serves a [`Store`] on `MASTER_ADDR:MASTER_PORT`; every
//! rank (rank 0 too) connects to it as a client, retrying until a deadline, since the ranks
//! start in any order. Ranks exchange small values through it: the NCCL backend's rank 0
//! puts the communicator's unique id under a key and the others [`Store::get`] it, which
//! blocks until the key is set or a timeout passes.
//!
//! # Protocol
//!
//! One request and one reply at a time per connection, all integers big-endian:
//!
//! | message | bytes |
//! | --- | --- |
//! | set | `b'S'`, key length `u32`, key, value length `u32`, value; reply `0` |
//! | get | `b'G'`, key length `u32`, key, timeout in ms `u64`; reply `0`, value length `u32`, value; or `1` (timed out) |
//!
//! Keys are at most [`MAX_KEY`] bytes and values at most [`MAX_VALUE`]; the server closes a
//! connection that sends anything else. The store holds what ranks put in it for the life of
//! the server; it is meant for a handful of small values per communicator, not for data.
//!
//! # Threads
//!
//! The server has one thread that accepts connections and one per connection, each blocked
//! in a read or, for a `get` of a key not yet set, in a wait on a condition variable with
//! the request's timeout: none spins. Dropping the [`Store`] that serves stops the accepting
//! thread; a connection's thread ends when its client closes the connection, or when a
//! `get` it serves times out and the client has gone.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// The longest key the store accepts, in bytes.
pub const MAX_KEY: usize = 4096;
/// The largest value the store accepts, in bytes.
pub const MAX_VALUE: usize = 1 << 20;
/// How long [`Store::connect`] keeps retrying by default ([`Rendezvous::store`]).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(300);
/// The pause between two attempts to connect.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// What can go wrong in the rendezvous.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RendezvousError {
    /// An environment variable the rendezvous needs is not set.
    #[error("the environment variable {var} is not set (a launcher such as torchrun sets it)")]
    Missing {
        /// The variable.
        var: &'static str,
    },
    /// An environment variable has a value the rendezvous cannot use.
    #[error("the environment variable {var}={value:?} is malformed: {why}")]
    Malformed {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        why: String,
    },
    /// The store cannot be served, reached or used.
    #[error("store at {addr}: {what}")]
    Io {
        /// The store's address.
        addr: String,
        /// What failed.
        what: String,
    },
    /// A [`Store::get`] found no value within its timeout (a rank that never came).
    #[error("store: no value for the key {key:?} within {after:?}")]
    Timeout {
        /// The key.
        key: String,
        /// The timeout.
        after: Duration,
    },
    /// A key or value over the store's limits.
    #[error("store: {0}")]
    TooLarge(String),
}

/// Where this process stands in a job, as a torchrun-style launcher says
/// ([`from_env`](Self::from_env)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendezvous {
    /// Ranks in the job (`WORLD_SIZE`).
    pub world_size: usize,
    /// This process's rank (`RANK`), below `world_size`.
    pub rank: usize,
    /// This process's rank among those of its machine (`LOCAL_RANK`): the index of its GPU.
    pub local_rank: usize,
    /// The host of rank 0's store (`MASTER_ADDR`).
    pub master_addr: String,
    /// Its port (`MASTER_PORT`).
    pub master_port: u16,
}

impl Rendezvous {
    /// Read `WORLD_SIZE`, `RANK`, `LOCAL_RANK`, `MASTER_ADDR` and `MASTER_PORT`. A missing
    /// variable is [`RendezvousError::Missing`], a value that is not a number (or a rank not
    /// below the world size, a world size of 0) is [`RendezvousError::Malformed`], each
    /// naming the variable.
    pub fn from_env() -> Result<Rendezvous, RendezvousError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`from_env`](Self::from_env), with the variables from `get` (for tests, and for
    /// launchers that pass them otherwise).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Rendezvous, RendezvousError> {
        let var = |k: &'static str| get(k).ok_or(RendezvousError::Missing { var: k });
        let num = |k: &'static str| -> Result<usize, RendezvousError> {
            let v = var(k)?;
            v.trim().parse::<usize>().map_err(|e| RendezvousError::Malformed {
                var: k,
                value: v,
                why: e.to_string(),
            })
        };
        let world_size = num("WORLD_SIZE")?;
        if world_size == 0 {
            return Err(RendezvousError::Malformed {
                var: "WORLD_SIZE",
                value: "0".into(),
                why: "a job has at least one rank".into(),
            });
        }
        let rank = num("RANK")?;
        if rank >= world_size {
            return Err(RendezvousError::Malformed {
                var: "RANK",
                value: rank.to_string(),
                why: format!("not below WORLD_SIZE={world_size}"),
            });
        }
        let local_rank = num("LOCAL_RANK")?;
        let master_addr = var("MASTER_ADDR")?;
        if master_addr.trim().is_empty() {
            return Err(RendezvousError::Malformed {
                var: "MASTER_ADDR",
                value: master_addr,
                why: "empty".into(),
            });
        }
        let port = var("MASTER_PORT")?;
        let master_port = port.trim().parse::<u16>().map_err(|e| RendezvousError::Malformed {
            var: "MASTER_PORT",
            value: port.clone(),
            why: e.to_string(),
        })?;
        Ok(Rendezvous {
            world_size,
            rank,
            local_rank,
            master_addr: master_addr.trim().to_string(),
            master_port,
        })
    }

    /// The store of this job: served by rank 0 on `MASTER_ADDR:MASTER_PORT`, reached by
    /// every rank, retrying for `connect_timeout` (the ranks start in any order).
    pub fn store(&self, connect_timeout: Duration) -> Result<Store, RendezvousError> {
        let addr = format!("{}:{}", self.master_addr, self.master_port);
        if self.rank == 0 {
            Store::serve(&addr)
        } else {
            Store::connect(&addr, connect_timeout)
        }
    }
}

/// The values of a store's server, with a condition variable that `get`s wait on.
#[derive(Default)]
struct Table {
    map: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    changed: Condvar,
}

/// The server half of a [`Store`], owned by rank 0's.
struct Server {
    stop: Arc<AtomicBool>,
    addr: SocketAddr,
    accept: Option<JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accepting thread; it sees the flag and exits.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(j) = self.accept.take() {
            let _ = j.join();
        }
    }
}

/// A client of the rendezvous store (module docs); rank 0's also serves it.
pub struct Store {
    conn: Mutex<TcpStream>,
    addr: String,
    server: Option<Server>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("addr", &self.addr).field("serves", &self.server.is_some()).finish()
    }
}

impl Store {
    /// Serve a store on `addr` (`host:port`; port 0 picks a free one, which
    /// [`local_addr`](Self::local_addr) tells) and connect to it.
    pub fn serve(addr: &str) -> Result<Store, RendezvousError> {
        let io = |what: String| RendezvousError::Io { addr: addr.to_string(), what };
        let listener = TcpListener::bind(addr).map_err(|e| io(format!("cannot listen: {e}")))?;
        let local = listener.local_addr().map_err(|e| io(e.to_string()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let table = Arc::new(Table::default());
        let accept = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("eagervm-store".into())
                .spawn(move || accept_loop(listener, table, stop))
                .map_err(|e| io(format!("cannot start the server thread: {e}")))?
        };
        let server = Server { stop, addr: local, accept: Some(accept) };
        let mut store = Store::connect(&local.to_string(), Duration::from_secs(10))?;
        store.server = Some(server);
        Ok(store)
    }

    /// Connect to the store at `addr`, retrying (every 50 ms) until `timeout` has passed.
    pub fn connect(addr: &str, timeout: Duration) -> Result<Store, RendezvousError> {
        let deadline = Instant::now() + timeout;
        let io = |what: String| RendezvousError::Io { addr: addr.to_string(), what };
        loop {
            let attempt = addr
                .to_socket_addrs()
                .map_err(|e| format!("cannot resolve: {e}"))
                .and_then(|mut a| a.next().ok_or_else(|| "resolves to no address".to_string()))
                .and_then(|sa| {
                    let left =
                        deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
                    TcpStream::connect_timeout(&sa, left).map_err(|e| e.to_string())
                });
            match attempt {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    return Ok(Store { conn: Mutex::new(s), addr: addr.to_string(), server: None });
                }
                Err(e) if Instant::now() + RETRY_PAUSE >= deadline => {
                    return Err(io(format!("cannot connect within {timeout:?}: {e}")));
                }
                Err(_) => std::thread::sleep(RETRY_PAUSE),
            }
        }
    }

    /// The address of the server this store talks to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The address a serving store listens on (`None` for a client).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.server.as_ref().map(|s| s.addr)
    }

    /// Set `key` to `value` (replacing an earlier value).
    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), RendezvousError> {
        check_sizes(key, value.len())?;
        let mut msg = Vec::with_capacity(9 + key.len() + value.len());
        msg.push(b'S');
        put_bytes(&mut msg, key.as_bytes());
        put_bytes(&mut msg, value);
        let mut c = self.conn.lock();
        let r = c.write_all(&msg).and_then(|()| read_u8(&mut *c));
        match r {
            Ok(0) => Ok(()),
            Ok(b) => Err(self.io(format!("unexpected reply {b} to a set"))),
            Err(e) => Err(self.io(format!("set {key:?}: {e}"))),
        }
    }

    /// The value of `key`, waiting until some rank sets it or `timeout` passes
    /// ([`RendezvousError::Timeout`]).
    pub fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, RendezvousError> {
        check_sizes(key, 0)?;
        let mut msg = Vec::with_capacity(13 + key.len());
        msg.push(b'G');
        put_bytes(&mut msg, key.as_bytes());
        msg.extend_from_slice(&u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX).to_be_bytes());
        let mut c = self.conn.lock();
        let r = c.write_all(&msg).and_then(|()| match read_u8(&mut *c)? {
            0 => read_bytes(&mut *c, MAX_VALUE).map(Some),
            1 => Ok(None),
            b => Err(io::Error::new(io::ErrorKind::InvalidData, format!("unexpected reply {b} to a get"))),
        });
        match r {
            Ok(Some(v)) => Ok(v),
            Ok(None) => Err(RendezvousError::Timeout { key: key.to_string(), after: timeout }),
            Err(e) => Err(self.io(format!("get {key:?}: {e}"))),
        }
    }

    /// Wait until all `world_size` ranks have entered the barrier called `name` (each rank
    /// calls it with its own `rank`), or `timeout` passes.
    pub fn barrier(
        &self,
        name: &str,
        rank: usize,
        world_size: usize,
        timeout: Duration,
    ) -> Result<(), RendezvousError> {
        let deadline = Instant::now() + timeout;
        self.set(&format!("barrier/{name}/{rank}"), &[])?;
        for r in 0..world_size {
            let left = deadline.saturating_duration_since(Instant::now());
            self.get(&format!("barrier/{name}/{r}"), left)?;
        }
        Ok(())
    }

    fn io(&self, what: String) -> RendezvousError {
        RendezvousError::Io { addr: self.addr.clone(), what }
    }
}

fn check_sizes(key: &str, value: usize) -> Result<(), RendezvousError> {
    if key.len() > MAX_KEY {
        return Err(RendezvousError::TooLarge(format!("a key of {} bytes (at most {MAX_KEY})", key.len())));
    }
    if value > MAX_VALUE {
        return Err(RendezvousError::TooLarge(format!("a value of {value} bytes (at most {MAX_VALUE})")));
    }
    Ok(())
}

fn put_bytes(msg: &mut Vec<u8>, b: &[u8]) {
    // Lengths were checked against MAX_KEY / MAX_VALUE, both below u32::MAX.
    msg.extend_from_slice(&(b.len() as u32).to_be_bytes());
    msg.extend_from_slice(b);
}

fn read_u8(r: &mut impl Read) -> io::Result<u8> {
    let mut b = [0u8; 1];
    r.read_exact(&mut b)?;
    Ok(b[0])
}

fn read_bytes(r: &mut impl Read, max: usize) -> io::Result<Vec<u8>> {
    let mut n = [0u8; 4];
    r.read_exact(&mut n)?;
    let n = u32::from_be_bytes(n) as usize;
    if n > max {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("{n} bytes, at most {max}")));
    }
    let mut v = vec![0u8; n];
    r.read_exact(&mut v)?;
    Ok(v)
}

fn accept_loop(listener: TcpListener, table: Arc<Table>, stop: Arc<AtomicBool>) {
    for conn in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(conn) = conn else { continue };
        let _ = conn.set_nodelay(true);
        let table = table.clone();
        if let Err(e) =
            std::thread::Builder::new().name("eagervm-store-conn".into()).spawn(move || serve(conn, &table))
        {
            tracing::error!(error = %e, "store: cannot start a connection thread");
        }
    }
}

/// Serve one connection until the client closes it or sends something malformed.
fn serve(mut conn: TcpStream, table: &Table) {
    loop {
        let Ok(op) = read_u8(&mut conn) else { return };
        let Ok(key) = read_bytes(&mut conn, MAX_KEY) else { return };
        let reply = match op {
            b'S' => {
                let Ok(value) = read_bytes(&mut conn, MAX_VALUE) else { return };
                table.map.lock().insert(key, value);
                table.changed.notify_all();
                vec![0]
            }
            b'G' => {
                let mut ms = [0u8; 8];
                if conn.read_exact(&mut ms).is_err() {
                    return;
                }
                let timeout = Duration::from_millis(u64::from_be_bytes(ms));
                let deadline = Instant::now().checked_add(timeout);
                let mut map = table.map.lock();
                loop {
                    if let Some(v) = map.get(&key) {
                        let mut r = vec![0];
                        put_bytes(&mut r, v);
                        break r;
                    }
                    let timed_out = match deadline {
                        Some(d) => table.changed.wait_until(&mut map, d).timed_out(),
                        None => {
                            table.changed.wait(&mut map);
                            false
                        }
                    };
                    if timed_out && !map.contains_key(&key) {
                        break vec![1];
                    }
                }
            }
            _ => return,
        };
        if conn.write_all(&reply).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    const GOOD: [(&str, &str); 5] = [
        ("WORLD_SIZE", "4"),
        ("RANK", "2"),
        ("LOCAL_RANK", "0"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29500"),
    ];

    #[test]
    fn the_environment_is_read_and_checked() {
        let r = Rendezvous::from_lookup(env(&GOOD)).unwrap();
        assert_eq!(
            r,
            Rendezvous {
                world_size: 4,
                rank: 2,
                local_rank: 0,
                master_addr: "10.0.0.1".into(),
                master_port: 29500
            }
        );
        for missing in ["WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"] {
            let pairs: Vec<_> = GOOD.iter().copied().filter(|(k, _)| *k != missing).collect();
            let e = Rendezvous::from_lookup(env(&pairs)).unwrap_err();
            assert_eq!(e, RendezvousError::Missing { var: missing });
            assert!(e.to_string().contains(missing));
        }
        let with = |k: &str, v: &str| {
            let pairs: Vec<_> = GOOD.iter().map(|&(a, b)| if a == k { (a, v) } else { (a, b) }).collect();
            Rendezvous::from_lookup(env(&pairs)).unwrap_err()
        };
        for (k, v) in [
            ("WORLD_SIZE", "x"),
            ("WORLD_SIZE", "0"),
            ("RANK", "4"),
            ("LOCAL_RANK", "-1"),
            ("MASTER_PORT", "70000"),
            ("MASTER_ADDR", " "),
        ] {
            match with(k, v) {
                RendezvousError::Malformed { var, .. } => assert_eq!(var, k),
                other => panic!("{k}={v}: {other:?}"),
            }
        }
    }

    #[test]
    fn ranks_exchange_values_and_meet_at_barriers() {
        let world = 4;
        let server = Store::serve("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap().to_string();
        let t = Duration::from_secs(20);
        let started = Instant::now();
        let peers: Vec<_> = (1..world)
            .map(|rank| {
                let addr = addr.clone();
                std::thread::spawn(move || {
                    let s = Store::connect(&addr, t).unwrap();
                    // Waits until rank 0 sets it, whenever that is.
                    let id = s.get("nccl/world/id", t).unwrap();
                    s.set(&format!("seen/{rank}"), &id).unwrap();
                    s.barrier("end", rank, world, t).unwrap();
                    id
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(50));
        server.set("nccl/world/id", &[7u8; 128]).unwrap();
        for r in 1..world {
            assert_eq!(server.get(&format!("seen/{r}"), t).unwrap(), vec![7u8; 128]);
        }
        server.barrier("end", 0, world, t).unwrap();
        for p in peers {
            assert_eq!(p.join().unwrap(), vec![7u8; 128]);
        }
        assert!(started.elapsed() < t);
    }

    #[test]
    fn a_key_nobody_sets_times_out_and_the_store_still_serves() {
        let s = Store::serve("127.0.0.1:0").unwrap();
        let t0 = Instant::now();
        let e = s.get("never", Duration::from_millis(100)).unwrap_err();
        assert_eq!(e, RendezvousError::Timeout { key: "never".into(), after: Duration::from_millis(100) });
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_millis(100) && waited < Duration::from_secs(10), "{waited:?}");
        s.set("k", b"v").unwrap();
        assert_eq!(s.get("k", Duration::ZERO).unwrap(), b"v");
        assert!(matches!(s.set(&"x".repeat(MAX_KEY + 1), b""), Err(RendezvousError::TooLarge(_))));
    }

    #[test]
    fn connecting_to_nothing_fails_at_the_deadline() {
        // A port that was free a moment ago: nothing listens there.
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let t0 = Instant::now();
        let e = Store::connect(&format!("127.0.0.1:{port}"), Duration::from_millis(300)).unwrap_err();
        assert!(matches!(e, RendezvousError::Io { .. }), "{e:?}");
        assert!(t0.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_client_that_starts_first_waits_for_the_server() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr = format!("127.0.0.1:{port}");
        let a = addr.clone();
        let client = std::thread::spawn(move || {
            let s = Store::connect(&a, Duration::from_secs(20))?;
            s.get("ready", Duration::from_secs(20))
        });
        std::thread::sleep(Duration::from_millis(200));
        let server = Store::serve(&addr).unwrap();
        server.set("ready", b"yes").unwrap();
        assert_eq!(client.join().unwrap().unwrap(), b"yes");
    }

    #[test]
    fn the_rendezvous_serves_on_rank_0_and_connects_elsewhere() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let rdv = |rank| Rendezvous {
            world_size: 2,
            rank,
            local_rank: rank,
            master_addr: "127.0.0.1".into(),
            master_port: port,
        };
        let r0 = rdv(0).store(Duration::from_secs(20)).unwrap();
        assert!(r0.local_addr().is_some());
        let r1 = rdv(1).store(Duration::from_secs(20)).unwrap();
        assert!(r1.local_addr().is_none());
        r1.set("from-1", b"hi").unwrap();
        assert_eq!(r0.get("from-1", Duration::from_secs(20)).unwrap(), b"hi");
    }
}
