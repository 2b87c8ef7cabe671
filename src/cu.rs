//! CUDA driver types and result codes as the hooks see them at the C ABI.
//!
//! Types come from cudarc (types only: no cudarc function is ever called, DESIGN.md trap 2).
//! Results stay raw integers at the edge: the real driver may return a code newer than any
//! Rust enum knows, and the shim must hand it back unchanged.

use cudarc::driver::sys::cudaError_enum as E;
pub use cudarc::driver::sys::{CUcontext, CUdevice, CUdeviceptr, CUevent, CUstream};

/// A `CUresult` exactly as the driver returned it.
pub type CUresult = std::ffi::c_uint;
/// A device address (`CUdeviceptr`, 64-bit).
pub type DevPtr = CUdeviceptr;

pub const CUDA_SUCCESS: CUresult = E::CUDA_SUCCESS as CUresult;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = E::CUDA_ERROR_INVALID_VALUE as CUresult;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = E::CUDA_ERROR_OUT_OF_MEMORY as CUresult;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = E::CUDA_ERROR_NOT_INITIALIZED as CUresult;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = E::CUDA_ERROR_INVALID_CONTEXT as CUresult;
pub const CUDA_ERROR_NOT_FOUND: CUresult = E::CUDA_ERROR_NOT_FOUND as CUresult;
pub const CUDA_ERROR_UNKNOWN: CUresult = E::CUDA_ERROR_UNKNOWN as CUresult;

pub const CUDA_ERROR_NOT_READY: CUresult = E::CUDA_ERROR_NOT_READY as CUresult;

/// `CU_STREAM_LEGACY`: the legacy default stream, whatever the calling thread's default.
pub const CU_STREAM_LEGACY: usize = 0x1;
/// `CU_STREAM_NON_BLOCKING`: a stream that does not synchronize with the legacy stream.
pub const CU_STREAM_NON_BLOCKING: u32 = 0x1;
/// `CU_EVENT_DISABLE_TIMING`.
pub const CU_EVENT_DISABLE_TIMING: u32 = 0x2;

/// `CU_GET_PROC_ADDRESS_*` flag: the per-thread-default-stream (`_ptsz`/`_ptds`) variants.
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;
