//! DLPack's C ABI (`dlpack.h`, v1.x), written out here: the structs are frozen, and the Rust
//! crates that carry them bring their own PyO3.

use std::ffi::{c_void, CStr};

/// `DLDeviceType::kDLCPU`.
pub(super) const DL_CPU: i32 = 1;
/// `kDLCUDA`: CUDA device memory.
pub(crate) const DL_CUDA: i32 = 2;
/// `kDLCUDAHost`: page-locked host memory, which the CPU reads as any other.
pub(super) const DL_CUDA_HOST: i32 = 3;
/// `DLDataTypeCode::kDLInt`.
pub(super) const DL_INT: u8 = 0;
/// `kDLUInt`.
pub(super) const DL_UINT: u8 = 1;
/// `kDLFloat`.
pub(super) const DL_FLOAT: u8 = 2;
/// `kDLBfloat`.
pub(super) const DL_BFLOAT: u8 = 4;
/// `kDLBool`.
pub(super) const DL_BOOL: u8 = 6;
/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
pub(super) const FLAG_READ_ONLY: u64 = 1 << 0;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`.
pub(super) const FLAG_IS_COPIED: u64 = 1 << 1;
/// The DLPack version of the versioned structs made and taken here.
pub(super) const DLPACK_MAJOR: u32 = 1;
pub(super) const DLPACK_MINOR: u32 = 0;

pub(super) const LEGACY: &CStr = c"dltensor";
pub(super) const LEGACY_USED: &CStr = c"used_dltensor";
pub(super) const VERSIONED: &CStr = c"dltensor_versioned";
pub(super) const VERSIONED_USED: &CStr = c"used_dltensor_versioned";

/// `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct DlDevice {
    pub(super) device_type: i32,
    pub(super) device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct DlDataType {
    pub(super) code: u8,
    pub(super) bits: u8,
    pub(super) lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
pub(super) struct DlTensor {
    pub(super) data: *mut c_void,
    pub(super) device: DlDevice,
    pub(super) ndim: i32,
    pub(super) dtype: DlDataType,
    pub(super) shape: *mut i64,
    /// In elements; null for a compact row-major tensor.
    pub(super) strides: *mut i64,
    pub(super) byte_offset: u64,
}

/// `DLManagedTensor` (the legacy, unversioned struct of capsule `dltensor`).
#[repr(C)]
pub(super) struct DlManagedTensor {
    pub(super) dl_tensor: DlTensor,
    pub(super) manager_ctx: *mut c_void,
    pub(super) deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// `DLPackVersion`.
#[repr(C)]
pub(super) struct DlPackVersion {
    pub(super) major: u32,
    pub(super) minor: u32,
}

/// `DLManagedTensorVersioned` (capsule `dltensor_versioned`).
#[repr(C)]
pub(super) struct DlManagedTensorVersioned {
    pub(super) version: DlPackVersion,
    pub(super) manager_ctx: *mut c_void,
    pub(super) deleter: Option<unsafe extern "C" fn(*mut DlManagedTensorVersioned)>,
    pub(super) flags: u64,
    pub(super) dl_tensor: DlTensor,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_structs_have_dlpack_s_layout() {
        // dlpack.h on a 64-bit target.
        assert_eq!(std::mem::size_of::<DlDevice>(), 8);
        assert_eq!(std::mem::size_of::<DlDataType>(), 4);
        assert_eq!(std::mem::size_of::<DlTensor>(), 48);
        assert_eq!(std::mem::offset_of!(DlTensor, shape), 24);
        assert_eq!(std::mem::offset_of!(DlTensor, byte_offset), 40);
        assert_eq!(std::mem::size_of::<DlManagedTensor>(), 64);
        assert_eq!(std::mem::offset_of!(DlManagedTensorVersioned, flags), 24);
        assert_eq!(std::mem::offset_of!(DlManagedTensorVersioned, dl_tensor), 32);
    }
}
