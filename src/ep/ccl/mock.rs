//! The mock collective backend: a communicator whose ranks are all devices of one VM.
//!
//! A test double, like the mock device it is made for. Every rank is a local member, so
//! one call of [`Backend::run`] has every rank's buffers and computes the result directly
//! (sums in rank order, so results are reproducible bit for bit). It works on any devices
//! whose tensors live in host memory: mock devices and the CPU.
//!
//! It exists so that collectives can be mixed into the property tests' random programs and
//! checked against a sequential interpreter, and so that the failure paths can be tested
//! without a second process: [`MockBackend::hang_at`] makes one collective wait for a peer
//! that never comes, as a collective does when a rank has died, until the communicator is
//! aborted.

use std::fmt;

use super::reduce::{combine, finish};
use super::{check_parts, Backend, Buf, BufMut, Call, CclError, Collective, Member, Part};
use crate::ep::DeviceId;
use crate::sync::{Condvar, Mutex};

/// A communicator over devices of one VM (module docs).
pub struct MockBackend {
    members: Vec<Member>,
    /// `Some(why)` once aborted.
    state: Mutex<Option<String>>,
    aborted: Condvar,
    /// The `seq` of a call that waits until the communicator is aborted.
    hang_at: Option<u64>,
}

impl MockBackend {
    /// A communicator whose rank `r` is `devices[r]`.
    pub fn new(devices: &[DeviceId]) -> Result<MockBackend, CclError> {
        if devices.is_empty() {
            return Err(CclError::Invalid("a communicator needs at least one device".into()));
        }
        if let Some(d) =
            devices.iter().find(|d| !matches!(d.ty, crate::ep::DeviceType::Mock | crate::ep::DeviceType::Cpu))
        {
            return Err(CclError::Invalid(format!(
                "the mock backend works on mock and cpu devices, not {d}"
            )));
        }
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].contains(d) {
                return Err(CclError::Invalid(format!("{d} is named twice")));
            }
        }
        Ok(MockBackend {
            members: devices.iter().enumerate().map(|(rank, &device)| Member { device, rank }).collect(),
            state: Mutex::new(None),
            aborted: Condvar::new(),
            hang_at: None,
        })
    }

    /// `self`, with its `seq`-th collective (from 0) waiting for a peer that never comes:
    /// it returns only when the communicator is aborted, with [`CclError::Aborted`].
    pub fn hang_at(mut self, seq: u64) -> MockBackend {
        self.hang_at = Some(seq);
        self
    }
}

impl fmt::Debug for MockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockBackend").field("members", &self.members).field("hang_at", &self.hang_at).finish()
    }
}

fn host<'b>(b: &'b Buf<'_>) -> Result<&'b [u8], CclError> {
    match b {
        Buf::Host(s) => Ok(s),
        Buf::Device(_) => Err(CclError::Invalid("the mock backend needs host buffers".into())),
    }
}

fn host_mut<'b>(b: &'b mut BufMut<'_>) -> Result<&'b mut [u8], CclError> {
    match b {
        BufMut::Host(s) => Ok(s),
        BufMut::Device(_) => Err(CclError::Invalid("the mock backend needs host buffers".into())),
    }
}

impl Backend for MockBackend {
    fn kind(&self) -> &'static str {
        "mock"
    }

    fn world_size(&self) -> usize {
        self.members.len()
    }

    fn members(&self) -> &[Member] {
        &self.members
    }

    fn run(&self, call: &Call, parts: &mut [Part<'_>]) -> Result<(), CclError> {
        if let Some(why) = self.aborted() {
            return Err(CclError::Aborted(why));
        }
        let world = self.members.len();
        check_parts(call, world, &self.members, parts)?;
        if self.hang_at == Some(call.seq) {
            let mut state = self.state.lock();
            while state.is_none() {
                self.aborted.wait(&mut state);
            }
            return Err(CclError::Aborted(state.clone().unwrap_or_default()));
        }
        let (dtype, bytes) = (call.dtype, call.count * call.dtype.size());
        match call.op {
            Collective::AllReduce(op) | Collective::ReduceScatter(op) => {
                let mut acc = host(&parts[0].send)?.to_vec();
                for p in &parts[1..] {
                    combine(&mut acc, host(&p.send)?, dtype, op);
                }
                finish(&mut acc, dtype, op, world);
                let slice = if matches!(call.op, Collective::AllReduce(_)) { bytes } else { bytes / world };
                for (r, p) in parts.iter_mut().enumerate() {
                    let from = if slice == bytes { 0 } else { r * slice };
                    host_mut(&mut p.recv)?.copy_from_slice(&acc[from..from + slice]);
                }
            }
            Collective::Broadcast { root } => {
                let data = host(&parts[root].send)?.to_vec();
                for p in parts.iter_mut() {
                    host_mut(&mut p.recv)?.copy_from_slice(&data);
                }
            }
            Collective::AllGather => {
                let mut all = Vec::with_capacity(bytes * world);
                for p in parts.iter() {
                    all.extend_from_slice(host(&p.send)?);
                }
                for p in parts.iter_mut() {
                    host_mut(&mut p.recv)?.copy_from_slice(&all);
                }
            }
            Collective::Barrier => {
                for p in parts.iter_mut() {
                    host_mut(&mut p.recv)?.copy_from_slice(&(world as i64).to_ne_bytes());
                }
            }
        }
        Ok(())
    }

    fn abort(&self, why: &str) {
        let mut state = self.state.lock();
        if state.is_none() {
            *state = Some(why.to_string());
        }
        self.aborted.notify_all();
    }

    fn aborted(&self) -> Option<String> {
        self.state.lock().clone()
    }
}
