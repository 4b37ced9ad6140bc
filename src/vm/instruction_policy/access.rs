//! Host accesses on the host stream: `Read` (`Tensor::to_vec`), `Wait` (`Tensor::wait`, and
//! `Tensor::lend_host`, whose wait lends the storage) and `Write` (a batch's `write`). A read answers its caller through the access's slot with a
//! copy of the tensor's bytes or the error it carries; a write overwrites the tensor and
//! clears its error.

use crate::alloc::Contents;
use crate::ep::EpError;
use crate::vm::Error;

use super::super::instruction::{AccessSlot, Operand};
use super::op_call::fail;
use super::ExecEnv;

/// A host read (`wait_only`: only the error state) of `op`'s tensor into `slot`.
pub(super) fn read_access(op: &Operand, slot: &AccessSlot, wait_only: bool, program: u64, env: &ExecEnv) {
    // SAFETY: the access is running, so its operand's tensor is alive.
    let t = unsafe { op.tensor() };
    // SAFETY: a read Access holds the read access to its operand.
    let v = unsafe { t.value() };
    let r = match (&v.error, &v.storage) {
        (Some(e), _) => Err((**e).clone()),
        // A lending wait (`Tensor::lend_host`): the read access keeps any writer and the
        // `Release` from running while the loan is taken (`alloc::lend`).
        (None, Some(s)) if slot.lends() => {
            slot.keep_loan(s.lend());
            Ok(Vec::new())
        }
        (None, None) if slot.lends() => {
            Err(Error::Uninitialized { instr: program, op: "Access".into(), tensor: t.id })
        }
        (None, _) if wait_only => Ok(Vec::new()),
        (None, Some(s)) => copy_out(s.as_bytes()).map_err(|source| Error::Alloc {
            instr: program,
            op: "Access".into(),
            stream: env.stream_name.clone(),
            source: EpError::OutOfMemory {
                device: t.meta.device,
                detail: format!("tensor {}: {source}, for the caller's copy of its values", t.id),
            },
        }),
        (None, None) => Err(Error::Uninitialized { instr: program, op: "Access".into(), tensor: t.id }),
    };
    slot.fulfil(r);
}

/// The caller's copy of a tensor's bytes, or the error of a refused allocation (never the
/// global allocator's abort): its size is the program's.
fn copy_out(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    out.try_reserve_exact(bytes.len())
        .map_err(|e| format!("out of memory allocating {} bytes ({e})", bytes.len()))?;
    out.extend_from_slice(bytes);
    Ok(out)
}

/// A host write of `bytes` into `op`'s tensor. A tensor without storage gets it here; if
/// that fails, the tensor carries [`Error::Alloc`] instead of the bytes.
pub(super) fn write_access(op: &Operand, bytes: &[u8], program: u64, env: &ExecEnv) {
    // SAFETY: the access is running, so its operand's tensor is alive.
    let t = unsafe { op.tensor() };
    // SAFETY: a write Access holds the write access to its operand.
    let v = unsafe { t.value_mut() };
    if v.storage.is_none() {
        // Accesses run on the host stream, whose allocator is the host's; the builder allows
        // them on host tensors only.
        match env.alloc.alloc_tensor(t.id, t.meta.device, t.meta.bytes(), Contents::Zeroed) {
            Ok(s) => v.storage = Some(s),
            Err(source) => {
                let e = Error::Alloc {
                    instr: program,
                    op: "Access".into(),
                    stream: env.stream_name.clone(),
                    source,
                };
                fail(std::slice::from_ref(op), e, env);
                return;
            }
        }
    }
    if let Some(storage) = &mut v.storage {
        storage.as_bytes_mut().copy_from_slice(bytes);
    }
    v.error = None;
}
