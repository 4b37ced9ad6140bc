//! The validator's rules for storages and views (version 3's `view` declarations).
//!
//! A view is a tensor over another tensor's storage, as `Tensor::view_layout` makes it: the
//! trace declares it with its owner, its dtype (the owner's) and its layout, and every rule
//! that concerns data applies to the storage, not to the tensor object:
//!
//! - **Declaration.** The owner is declared, live, and owns its storage (a view of a view
//!   names the owner, as the VM does); the dtype is the owner's; the layout has one stride
//!   per dimension and names elements of the owner's storage only
//!   (`TensorMeta::check_layout`). The view lives on its owner's device.
//! - **Releases.** A view's `release` frees the view alone; the owner's frees the storage.
//!   The VM emits the owner's after every view's (a view holds its owner until its own
//!   `Release` is submitted), so a trace that releases an owner while one of its views is
//!   live is refused: that view would use a freed storage.
//! - **Synchronisation.** A use through a view is a use of the storage (`trace::sync`
//!   state is kept per storage), as the builder's soft sync has it.
//! - **Calls.** The builder's output rules, by storage (`InstructionsBuilder`'s
//!   `check_outputs`): an output may share its storage with an input only as exactly that
//!   input's elements, to a kernel that works in place; it may not overlap an input
//!   otherwise, nor name one of its elements twice, nor share its storage with another
//!   output. A kernel over contiguous operands (`OpKernel::strided` false) takes no view of
//!   part of a storage: the builder gives it contiguous copies, which a trace lists as calls.
//! - **Host accesses** read or write a host tensor's storage whole: a view of part of it is
//!   refused (the VM copies such a view to a new host tensor first, and a trace lists that
//!   copy).

use super::{Checker, TensorState, ViewOf};
use crate::framework::layout::{self, Overlap};
use crate::framework::{shape, DType, OpKernel, TensorMeta};
use crate::trace::format::{DeviceKind, Ref, TraceDevice};
use crate::trace::sync::TensorSync;

/// A `view` statement's fields.
pub(super) struct ViewDecl<'s> {
    pub(super) id: Ref,
    pub(super) base: Ref,
    pub(super) dtype: DType,
    pub(super) shape: &'s [usize],
    pub(super) strides: &'s [isize],
    pub(super) offset: usize,
    pub(super) type_col: u32,
}

impl Checker<'_> {
    /// The tensor that owns `id`'s storage (`id` itself for an owner or an unknown tensor).
    pub(super) fn storage(&self, id: u32) -> u32 {
        self.tensors.get(&id).and_then(|t| t.view.as_ref()).map_or(id, |v| v.base)
    }

    /// `tensor t7 (a view of t3)`, or `tensor t3`.
    pub(super) fn named(&self, id: u32) -> String {
        match self.storage(id) {
            s if s == id => format!("tensor t{id}"),
            s => format!("tensor t{id} (a view of t{s})"),
        }
    }

    /// The meta of declared tensor `id`, its layout included.
    pub(super) fn meta_of(&self, id: u32) -> TensorMeta {
        let t = &self.tensors[&id];
        let meta = TensorMeta::new(&t.shape, t.dtype, t.device.device_id());
        match &t.view {
            Some(v) => meta.with_layout(&t.shape, &v.strides, v.offset),
            None => meta,
        }
    }

    /// Whether declared tensor `id`'s elements are its whole storage, in order (an owner;
    /// a view of all of it from the start, row-major), as `Tensor::is_whole` says.
    pub(super) fn is_whole(&self, id: u32) -> bool {
        let Some(v) = &self.tensors[&id].view else { return true };
        let meta = self.meta_of(id);
        v.offset == 0 && meta.is_contiguous() && meta.numel() == self.meta_of(v.base).numel()
    }

    /// A `view` declaration (module docs, "Declaration"); the view is declared whatever is
    /// wrong with it, so that its uses are not reported as undeclared too.
    pub(super) fn view(&mut self, d: ViewDecl<'_>) {
        let ViewDecl { id, base, dtype, shape, strides, offset, type_col } = d;
        let mut ok = self.tensor(base);
        let owner = self.tensors.get(&base.id);
        if let Some(of) = owner.and_then(|o| o.view.as_ref()).map(|v| v.base) {
            let m = format!(
                "tensor t{} is itself a view (of t{of}); a view names the tensor that owns the storage: t{of}",
                base.id
            );
            self.err(base.col, m);
            ok = false;
        }
        let (device, owner_dtype, too_large) = match self.tensors.get(&base.id) {
            Some(o) => (Some(o.device), o.dtype, o.too_large),
            None => (None, dtype, false),
        };
        if ok && owner_dtype != dtype {
            let m = format!(
                "view t{} is {dtype}, but t{} (its storage's owner) is {owner_dtype}",
                id.id, base.id
            );
            self.err(type_col, m);
            ok = false;
        }
        // `view_layout`'s own checks: an element count that is a number, and a layout
        // within the storage.
        if let Err(e) = shape::check(shape, dtype, u64::MAX, || format!("view t{}", id.id)) {
            self.err(type_col, e.to_string());
            ok = false;
        }
        if ok && !too_large {
            let storage = self.meta_of(base.id);
            let meta = storage.with_layout(shape, strides, offset);
            if let Err(why) = meta.check_layout(storage.numel()) {
                self.err(type_col, format!("view t{} of t{}: {why}", id.id, base.id));
                ok = false;
            }
        }
        let line = self.line;
        if ok {
            if let Some(o) = self.tensors.get_mut(&base.id) {
                o.live_views.push((id.id, line));
            }
        }
        let state = TensorState {
            dtype,
            shape: shape.to_vec(),
            // An unknown owner's device: the host, for the checks of later uses (the
            // declaration's diagnostic says what is wrong).
            device: device.unwrap_or(TraceDevice { kind: DeviceKind::Cpu, index: 0 }),
            released: None,
            // A view that is wrong is not checked further where it is used.
            too_large: too_large || !ok,
            view: Some(ViewOf { base: base.id, strides: strides.to_vec(), offset }),
            live_views: Vec::new(),
            sync: TensorSync::default(),
        };
        if self.tensors.insert(id.id, state).is_some() {
            self.err(id.col, format!("tensor t{} is declared twice", id.id));
        }
    }

    /// Before `tensor`'s `release`: an owner's comes after every view's (module docs,
    /// "Releases"); a view's ends it as a live view of its owner.
    pub(super) fn releasing(&mut self, tensor: Ref) {
        let id = tensor.id;
        match self.tensors[&id].view.as_ref().map(|v| v.base) {
            Some(base) => {
                if let Some(o) = self.tensors.get_mut(&base) {
                    o.live_views.retain(|&(v, _)| v != id);
                }
            }
            None => {
                if let Some(&(v, at)) = self.tensors[&id].live_views.first() {
                    let m = format!(
                        "tensor t{id} is released while its view t{v} (declared at line {at}) is live: a view's \
                         `release` comes before its owner's"
                    );
                    self.err(tensor.col, m);
                }
            }
        }
    }

    /// The builder's rules for a call's outputs, by storage (module docs, "Calls"); returns
    /// whether they hold (the first problem is reported).
    pub(super) fn outputs_allowed(
        &mut self,
        op: &str,
        kernel: &dyn OpKernel,
        inputs: &[Ref],
        outputs: &[Ref],
    ) -> bool {
        for (i, o) in outputs.iter().enumerate() {
            let (om, storage) = (self.meta_of(o.id), self.storage(o.id));
            if layout::has_internal_overlap(&om) {
                let m = format!(
                    "{} is an output of `{op}` that names some of its elements more than once ({})",
                    self.named(o.id),
                    om.describe()
                );
                self.err(o.col, m);
                return false;
            }
            if let Some(p) = outputs[..i].iter().find(|p| self.storage(p.id) == storage) {
                let m = match p.id == o.id {
                    true => format!("tensor t{} is given twice as an output of `{op}`", o.id),
                    false => format!(
                        "{} shares its storage with output t{} of `{op}`; write to a new tensor",
                        self.named(o.id),
                        p.id
                    ),
                };
                self.err(o.col, m);
                return false;
            }
            for x in inputs.iter().filter(|x| self.storage(x.id) == storage) {
                let xm = self.meta_of(x.id);
                let m = match layout::overlap(&xm, &om) {
                    Overlap::Partial => format!(
                        "{} ({}) overlaps input t{} ({}) in their storage, other than element for element",
                        self.named(o.id),
                        om.describe(),
                        x.id,
                        xm.describe()
                    ),
                    _ if kernel.in_place() => continue,
                    _ if x.id == o.id => format!("tensor t{} is both an input and an output of `{op}`", o.id),
                    _ => format!(
                        "{} shares its storage with input t{} of `{op}`, which does not work in place",
                        self.named(o.id),
                        x.id
                    ),
                };
                self.err(o.col, m);
                return false;
            }
        }
        true
    }

    /// A kernel over contiguous operands takes no view of part of a storage (module docs,
    /// "Calls"); returns whether none is given.
    pub(super) fn layouts_allowed(&mut self, op: &str, kernel: &dyn OpKernel, operands: &[Ref]) -> bool {
        if kernel.strided() {
            return true;
        }
        let Some(r) = operands.iter().find(|r| !self.is_whole(r.id)) else { return true };
        let m = format!(
            "`{op}` takes operands that are their whole storage, in order, but {} is not ({}): a program's \
             builder gives such a kernel a contiguous copy, made by a `copy` call",
            self.named(r.id),
            self.meta_of(r.id).describe()
        );
        self.err(r.col, m);
        false
    }
}
