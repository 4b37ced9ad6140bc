//! The rule: which calls the builder accepts, stated once, and the caches of it that the
//! common calls take.
//!
//! # The rule
//!
//! A call of `op` on `stream` with `inputs`, and the `outputs` it writes (given, for
//! `call_into`; made by the builder, for `call` and `call_multi`), is accepted when, in this
//! order (the first item that fails gives the call's error):
//!
//! 1. `stream` is one of the VM's streams (`Error::Config`), and `op` has a kernel on its
//!    device (`UnknownOp`);
//! 2. it has at most [`MAX_INPUTS`] inputs (`InvalidOperands`);
//! 3. every operand is a tensor of this VM (`ForeignTensor`) and live (`Released`);
//! 4. its outputs are writable ([`check_outputs`]): none writes an element twice or shares
//!    its storage with another output, none overlaps an input other than element for
//!    element (`Overlap`), and one that is exactly an input's elements needs a kernel that
//!    works in place (`Aliased`);
//! 5. its signature passes ([`signature_rule`](InstructionsBuilder::signature_rule)): every
//!    operand on the stream's device, or, for a copy, one end there (`WrongDevice`); the
//!    kernel's `infer` (`InvalidOperands`); the size check of every output it would make
//!    (`TooLarge`); given outputs as many as `infer` gives (`InvalidOperands`) and of its
//!    shapes and dtypes (`OutputMismatch`).
//!
//! What the rule answers for an accepted call ([`Checked`]): its kernel, and its outputs'
//! specs and meta ids. [`rule`](InstructionsBuilder::rule) is this list, in code.
//!
//! # Its caches
//!
//! Items 1, 2 and 5 depend on the call's signature alone (kernel, stream, attributes, input
//! count, each operand's meta id) and on the VM's configuration; items 3 and 4 on the
//! tensors' identity and state. So:
//!
//! - the inference cache (`framework::infer_cache`) keeps the signatures that passed item
//!   5, with their answer: the rule asks it before it runs item 5 again;
//! - [`cached_making`](InstructionsBuilder::cached_making) answers for `call` and
//!   `call_multi` in one pass over the inputs: at most `KEY_OPS` inputs, each a live tensor
//!   of this VM that is not a view, and a signature in the cache;
//! - [`cached_into`](InstructionsBuilder::cached_into) and
//!   [`cached_into_wide`](InstructionsBuilder::cached_into_wide) answer for `call_into` in
//!   one pass over the operands, reading each tensor's first line once: at least one output,
//!   at most `KEY_OPS` operands (packed key) or `WIDE_OPS` (wide key), each a live tensor
//!   of this VM that is not a view, no output the same tensor as another operand (without
//!   views, the only way two operands share storage), and a signature in the cache. They
//!   also answer that no operand needs soft sync (each last used on the call's stream, or
//!   never used), which lets the caller write the instruction at once.
//!
//! Each cache answers `None` where it cannot tell, and the rule then decides; where a cache
//! answers, its answer is the rule's. `rule_tests.rs` checks that on random calls for each
//! of the three.

use std::sync::atomic::Ordering;

use smallvec::SmallVec;

use crate::ep::DeviceId;
use crate::framework::infer_cache::{Key, WideKey, KEY_OPS, WIDE_OPS};
use crate::framework::layout;
use crate::framework::tensor::Tensor;
use crate::framework::{Attrs, Op, OutSpecs};
use crate::vm::shape;
use crate::vm::tensor::{MetaId, Strides, NO_STREAM};
use crate::vm::KernelRef;
use crate::vm::{EngineRef, Error, Result, StreamId, TensorMeta};

use super::{InstructionsBuilder, MAX_INPUTS};

/// What the rule answers for an accepted call: its kernel, and where its outputs' specs
/// are ([`InstructionsBuilder::outputs_of`]).
#[derive(Clone, Copy)]
pub(super) struct Checked {
    pub(super) kernel: KernelRef,
    /// The inference cache entry; `None`: the builder's `uncached` answer.
    entry: Option<usize>,
}

/// The outputs of a call, as the rule sees them.
#[derive(Clone, Copy)]
pub(super) enum Outputs<'a, 't> {
    /// The builder makes them (`call`, `call_multi`).
    Made,
    /// These (`call_into`).
    Given(&'a [&'t Tensor]),
}

/// What a cache of `call_into` answers for a call it passes: its kernel, and whether an
/// operand is used for the first time (the emission then marks every operand used on the
/// call's stream; every other operand was last used there).
#[derive(Clone, Copy)]
pub(super) struct Scanned {
    pub(super) kernel: KernelRef,
    pub(super) first_use: bool,
}

impl InstructionsBuilder<'_> {
    /// The rule (module docs), item by item. Opens the batch first (`open_if_idle`), so
    /// that an operand found live here has its `Release` held back until the batch is in
    /// the inbox (`framework::release`, "Explicit releases").
    pub(super) fn rule(
        &mut self,
        op: Op,
        inputs: &[&Tensor],
        outputs: Outputs<'_, '_>,
        attrs: &Attrs,
        stream: StreamId,
    ) -> Result<Checked> {
        self.open_if_idle();
        let given: &[&Tensor] = match outputs {
            Outputs::Made => &[],
            Outputs::Given(o) => o,
        };
        // 1.
        let device = self.vm.stream(stream)?.device;
        let Some(kernel) = op.kernel_ref(device.ty) else {
            return Err(self.front().unknown_op(op.name(), device));
        };
        // 2.
        if inputs.len() > MAX_INPUTS {
            return Err(Error::InvalidOperands {
                op: op.name().into(),
                detail: format!("has {} inputs; a call takes at most {MAX_INPUTS}", inputs.len()),
            });
        }
        // 3, before the inference cache is asked: its meta ids are this VM's.
        for t in inputs.iter().chain(given) {
            if !t.inner().belongs_to(self.me) {
                return Err(Error::ForeignTensor { op: op.name().into(), tensor: t.id() });
            }
            t.check_live()?;
        }
        // 4.
        check_outputs(op, kernel, inputs, given)?;
        // 5: a signature that passed before passes again.
        let ids = inputs.iter().chain(given).map(|t| t.inner().meta_id);
        let found = match Key::of(kernel, stream.0, attrs, inputs.len(), ids.clone()) {
            Some(key) => self.infer.find(&key),
            None => self.infer.get(kernel, stream.0, attrs, inputs.len(), ids),
        };
        let checked = match found {
            Some(entry) => Checked { kernel, entry: Some(entry) },
            None => self.signature_rule(op, kernel, inputs, given, attrs, stream, device)?,
        };
        // 5, given outputs as many as the op makes: a signature cached by `call`, which
        // makes its outputs, is also a `call_into` of the same inputs and no outputs.
        if let Outputs::Given(o) = outputs {
            let produced = self.outputs_of(checked).0.len();
            if produced != o.len() {
                return Err(Error::InvalidOperands {
                    op: op.name().into(),
                    detail: format!("produces {produced} outputs, {} given", o.len()),
                });
            }
        }
        // Outputs the call makes: row-major, but those of a pointwise op laid out like its
        // inputs, as PyTorch lays them out (`layout::pointwise_strides`), so that a
        // transposed input is read and the output written in memory order. Decided per
        // call, here: the inference cache knows shapes, not layouts.
        self.layouts.clear();
        if matches!(outputs, Outputs::Made) && kernel.pointwise() && kernel.strided() {
            let metas: SmallVec<[&TensorMeta; 8]> = inputs.iter().map(|t| t.meta()).collect();
            let layouts: Vec<Strides> = self
                .outputs_of(checked)
                .0
                .iter()
                .map_while(|s| layout::pointwise_strides(&s.shape, &metas))
                .collect();
            if layouts.len() == self.outputs_of(checked).0.len() {
                self.layouts = layouts;
            }
        }
        Ok(checked)
    }

    /// The output specs and meta ids of an accepted call.
    pub(super) fn outputs_of(&self, c: Checked) -> (&OutSpecs, &[MetaId]) {
        match c.entry {
            Some(i) => self.infer.outputs(i),
            None => (&self.uncached.0, &self.uncached.1),
        }
    }

    /// Item 5 of the rule, for a signature not in the inference cache: check devices, run
    /// the kernel's `infer` and the size check, compare the given outputs with its answer,
    /// and cache the signature if it passes.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn signature_rule(
        &mut self,
        op: Op,
        kernel: KernelRef,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
        attrs: &Attrs,
        stream: StreamId,
        device: DeviceId,
    ) -> Result<Checked> {
        let n = inputs.len() + outputs.len();
        let on_device = inputs.iter().chain(outputs).filter(|t| t.device() == device).count();
        // A copy needs one end on the stream's device: a given output there, or, with no
        // outputs given (`call`), the output the call makes there.
        if on_device < n && !kernel.cross_device() || on_device == 0 && !outputs.is_empty() {
            return Err(wrong_device(op, kernel, inputs, outputs, device));
        }
        let name = || op.name().to_string();
        let in_metas: SmallVec<[&TensorMeta; 8]> = inputs.iter().map(|t| t.meta()).collect();
        let given: SmallVec<[&TensorMeta; 2]> = outputs.iter().map(|t| t.meta()).collect();
        let mut specs = OutSpecs::new();
        kernel
            .infer(&in_metas, &given, attrs, &mut specs)
            .map_err(|detail| Error::InvalidOperands { op: name(), detail })?;
        // Every output the call would create passes the one size check (`framework::shape`)
        // here, before the signature is cached: a cached call makes outputs of the same
        // shapes, so it needs no check. Given outputs must equal these (below).
        let limit = self.vm.config().max_tensor_bytes;
        for (i, s) in specs.iter().enumerate() {
            shape::check(&s.shape, s.dtype, limit, || format!("output {i} of `{}` on {device}", op.name()))?;
        }
        if !outputs.is_empty() {
            if specs.len() != outputs.len() {
                return Err(Error::InvalidOperands {
                    op: name(),
                    detail: format!("produces {} outputs, {} given", specs.len(), outputs.len()),
                });
            }
            for (i, (s, t)) in specs.iter().zip(outputs).enumerate() {
                if s.shape != t.meta().shape || s.dtype != t.dtype() {
                    let want = TensorMeta::new(&s.shape, s.dtype, device);
                    return Err(Error::OutputMismatch {
                        op: name(),
                        index: i,
                        expected: want.describe(),
                        found: t.meta().describe(),
                    });
                }
            }
        }
        let out_ids: SmallVec<[MetaId; 2]> =
            specs.iter().map(|s| self.vm.intern(&TensorMeta::new(&s.shape, s.dtype, device))).collect();
        let ids: SmallVec<[MetaId; 4]> = inputs.iter().chain(outputs).map(|t| t.inner().meta_id).collect();
        match self.infer.insert(kernel, stream.0, attrs, inputs.len(), ids, specs.clone(), out_ids.clone()) {
            Some(i) => Ok(Checked { kernel, entry: Some(i) }),
            None => {
                self.uncached = (specs, out_ids);
                Ok(Checked { kernel, entry: None })
            }
        }
    }

    /// The rule for a call whose outputs the builder makes (`call`, `call_multi`), as a
    /// cache (module docs): one pass over the inputs; `None`, having changed nothing, where
    /// it cannot tell. Inputs last used on another stream pass: the emission adds the soft
    /// sync. The caller has opened the batch.
    #[inline(always)]
    pub(super) fn cached_making(
        &mut self,
        op: &Op,
        inputs: &[&Tensor],
        attrs: Attrs,
        stream: StreamId,
    ) -> Option<Checked> {
        let n = inputs.len();
        if n > KEY_OPS {
            return None;
        }
        let s = self.streams().get(stream.index())?;
        let kernel = op.kernel_ref(s.device.ty)?;
        let mut ids = [MetaId(0); KEY_OPS];
        let mut refused = false;
        for (id, t) in ids.iter_mut().zip(inputs) {
            let t = t.inner();
            *id = t.meta_id;
            // Views go the full way: a kernel may need them copied (module docs of
            // `framework::builder`, "Layouts"); and so do owners not in row-major order
            // (`whole` false): a pointwise op lays out its outputs like them, which the
            // cache does not know (`layouts`).
            refused |= t.released.load(Ordering::Relaxed) | !t.belongs_to(self.me) | t.is_view() | !t.whole;
        }
        if refused {
            return None;
        }
        let entry = self.infer.find(&Key::new(kernel, stream.0, &attrs, n, n, &ids))?;
        Some(Checked { kernel, entry: Some(entry) })
    }

    /// The rule for `call_into` of at most `KEY_OPS` operands, as a cache (module docs): one
    /// pass over the operands, each tensor's VM, identity, state and meta id read from one
    /// line; `None`, having changed nothing, where it cannot tell (a wider call included:
    /// [`cached_into_wide`](Self::cached_into_wide)). The caller has opened the batch.
    #[inline(always)]
    pub(super) fn cached_into(
        &mut self,
        op: &Op,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
        attrs: Attrs,
        stream: StreamId,
    ) -> Option<Scanned> {
        let (n_in, n) = (inputs.len(), inputs.len() + outputs.len());
        if outputs.is_empty() || n > KEY_OPS {
            return None;
        }
        let s = self.streams().get(stream.index())?;
        let kernel = op.kernel_ref(s.device.ty)?;
        let mut ids = [MetaId(0); KEY_OPS];
        let first_use = scan_operands::<false>(&mut ids, inputs, outputs, stream.0, self.me)?;
        self.infer.find(&Key::new(kernel, stream.0, &attrs, n_in, n, &ids))?;
        Some(Scanned { kernel, first_use })
    }

    /// [`cached_into`](Self::cached_into) for a call of up to `WIDE_OPS` operands, found by
    /// its wide key. (Its first lines repeat `cached_into`'s: one generic function for both,
    /// taking the lookup as a closure, made the narrow path slower per call:
    /// `docs/performance.md`, "Why the hot paths are shaped so", has the measurement.)
    #[inline(always)]
    pub(super) fn cached_into_wide(
        &mut self,
        op: &Op,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
        attrs: Attrs,
        stream: StreamId,
    ) -> Option<Scanned> {
        let n = inputs.len() + outputs.len();
        if outputs.is_empty() || n > WIDE_OPS {
            return None;
        }
        let s = self.streams().get(stream.index())?;
        let kernel = op.kernel_ref(s.device.ty)?;
        let mut ids = [MetaId(0); WIDE_OPS];
        let first_use = scan_operands::<true>(&mut ids, inputs, outputs, stream.0, self.me)?;
        self.infer.find_wide(&WideKey::new(kernel, stream.0, &attrs, inputs.len(), n, &ids))?;
        Some(Scanned { kernel, first_use })
    }
}

/// Item 4 of the rule: a call's outputs against its other operands, by storage. An output
/// that is exactly an input's elements is allowed to a kernel that works in place
/// ([`Error::Aliased`] otherwise); one that overlaps an input other than element for
/// element, or names an element twice, is refused ([`Error::Overlap`]), as are two outputs
/// of one storage; one that shares its storage with an input at other elements is allowed.
pub(super) fn check_outputs(
    op: Op,
    kernel: KernelRef,
    inputs: &[&Tensor],
    outputs: &[&Tensor],
) -> Result<()> {
    let aliased = |o: &Tensor| Error::Aliased { op: op.name().into(), tensor: o.id() };
    for (i, o) in outputs.iter().enumerate() {
        let (oi, om) = (o.inner(), o.meta());
        if layout::has_internal_overlap(om) {
            return Err(Error::Overlap {
                op: op.name().into(),
                output: o.id(),
                detail: format!("writes some of its elements more than once ({})", om.describe()),
            });
        }
        if outputs[..i].iter().any(|t| std::ptr::eq(t.inner().owner(), oi.owner())) {
            return Err(aliased(o));
        }
        for t in inputs.iter().filter(|t| std::ptr::eq(t.inner().owner(), oi.owner())) {
            // Elements the output shares with no input, or that cannot be told from the
            // layouts (PyTorch lets those through too), are the kernel's to read and write
            // in its order: a kernel over contiguous operands never sees such a pair, as one
            // of the two is a view that the builder copies (`framework::builder`, "Layouts").
            match layout::overlap(t.meta(), om) {
                layout::Overlap::Same if kernel.in_place() => {}
                layout::Overlap::Same => return Err(aliased(o)),
                layout::Overlap::None | layout::Overlap::Unknown => {}
                layout::Overlap::Partial => {
                    return Err(Error::Overlap {
                        op: op.name().into(),
                        output: o.id(),
                        detail: format!(
                            "({}) overlaps input tensor {} ({}) in their storage",
                            om.describe(),
                            t.id(),
                            t.meta().describe()
                        ),
                    })
                }
            }
        }
    }
    Ok(())
}

/// The error for a call with an operand on the wrong device: the first operand off the
/// stream's device (or, for a copy, the first operand, when none is on it).
#[cold]
fn wrong_device(
    op: Op,
    kernel: KernelRef,
    inputs: &[&Tensor],
    outputs: &[&Tensor],
    device: DeviceId,
) -> Error {
    let mut all = inputs.iter().chain(outputs);
    let t = if kernel.cross_device() {
        all.next().expect("a copy with no operands has none on the device: checked by the caller")
    } else {
        all.find(|t| t.device() != device).expect("some operand is off the device")
    };
    Error::WrongDevice {
        op: op.name().into(),
        tensor: t.id(),
        tensor_device: t.device(),
        stream_device: device,
    }
}

/// One pass over a call's operands for the caches of `call_into`: their meta ids into `ids`
/// (inputs, then outputs; `ids` has room for them all), and whether the cache can answer for
/// the call on stream `me` of the VM `vm`: `None` if an operand belongs to another VM, is
/// released or a view, was last used on another stream (soft sync needed), or an output is
/// another operand; otherwise whether any operand is used for the first time. `WIDE`: for
/// [`cached_into_wide`](InstructionsBuilder::cached_into_wide), whose operand counts are not
/// known where it is compiled.
///
/// The pass asks one question per operand: is it this VM's, live, and last used on `me`?
/// Any other answer (a tensor never used is the one that passes) sends the call to
/// [`scan_unusual`], which asks again, operand by operand. A loop's calls find their
/// operands last used on their own stream, so the common pass keeps no second flag.
#[inline(always)]
fn scan_operands<const WIDE: bool>(
    ids: &mut [MetaId],
    inputs: &[&Tensor],
    outputs: &[&Tensor],
    me: u32,
    vm: EngineRef,
) -> Option<bool> {
    let mut unusual = false;
    let mut scan = |id: &mut MetaId, t: &&Tensor| {
        let t = t.inner();
        *id = t.meta_id;
        // The VM's identity lies in the line the other fields come from: one more
        // comparison, folded into the same flag (the rule refuses a foreign operand before
        // its meta id, another VM's number, meets the inference cache). A view goes to the
        // rule too: its storage's soft-sync state and aliasing are its owner's (`rule`,
        // `sync_operands`).
        unusual |= t.released.load(Ordering::Relaxed)
            | (t.last_stream.load(Ordering::Relaxed) != me)
            | !t.belongs_to(vm)
            | t.is_view();
    };
    if WIDE {
        // Inputs, then outputs, each a loop of its own: one loop over the two chained
        // tests which half it is in on every operand. (A narrow call's operand counts are
        // known where it is inlined, and its chained loop unrolls to fewer instructions
        // than the split one.)
        let (in_ids, out_ids) = ids.split_at_mut(inputs.len().min(ids.len()));
        in_ids.iter_mut().zip(inputs).for_each(|(id, t)| scan(id, t));
        out_ids.iter_mut().zip(outputs).for_each(|(id, t)| scan(id, t));
    } else {
        ids.iter_mut().zip(inputs.iter().chain(outputs)).for_each(|(id, t)| scan(id, t));
    }
    // Every pair compared, with no early exit: a loop that stops at the first match ends on
    // a branch that is mispredicted once per call.
    let mut aliased = false;
    for (i, o) in outputs.iter().enumerate() {
        aliased |=
            inputs.iter().chain(&outputs[..i]).fold(false, |a, t| a | std::ptr::eq(t.inner(), o.inner()));
    }
    match (aliased, unusual) {
        (true, _) => None,
        (false, false) => Some(false),
        (false, true) => scan_unusual(inputs, outputs, me, vm),
    }
}

/// [`scan_operands`]'s answer for a call one of whose operands is not a live tensor of
/// this VM last used on `me`: `Some(true)` if each such operand is a live tensor (not a
/// view) of this VM that nothing has used yet, else `None`.
#[cold]
#[inline(never)]
fn scan_unusual(inputs: &[&Tensor], outputs: &[&Tensor], me: u32, vm: EngineRef) -> Option<bool> {
    let passes = inputs.iter().chain(outputs).all(|t| {
        let t = t.inner();
        let last = t.last_stream.load(Ordering::Relaxed);
        !t.released.load(Ordering::Relaxed)
            && t.belongs_to(vm)
            && !t.is_view()
            && (last == me || last == NO_STREAM)
    });
    passes.then_some(true)
}
