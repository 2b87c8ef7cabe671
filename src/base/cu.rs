//! CUDA driver types and result codes as the hooks see them at the C ABI.
//!
//! Types come from cudarc (types only: no cudarc function is ever called, docs/design.md, trap 2).
//! Results stay raw integers at the edge: the real driver may return a code newer than any
//! Rust enum knows, and the shim must hand it back unchanged.

use cudarc::driver::sys::cudaError_enum as E;
pub use cudarc::driver::sys::{
    CUcontext, CUdevice, CUdeviceptr, CUevent, CUipcMemHandle, CUstream,
};

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
pub const CUDA_ERROR_OPERATING_SYSTEM: CUresult = E::CUDA_ERROR_OPERATING_SYSTEM as CUresult;

pub const CUDA_ERROR_NOT_READY: CUresult = E::CUDA_ERROR_NOT_READY as CUresult;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = E::CUDA_ERROR_NOT_SUPPORTED as CUresult;
pub const CUDA_ERROR_NOT_PERMITTED: CUresult = E::CUDA_ERROR_NOT_PERMITTED as CUresult;
pub const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: CUresult =
    E::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED as CUresult;

/// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`: the start of the allocation holding a pointer.
pub const CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: std::ffi::c_int = 11;
/// `CU_POINTER_ATTRIBUTE_RANGE_SIZE`: the size of the allocation holding a pointer.
pub const CU_POINTER_ATTRIBUTE_RANGE_SIZE: std::ffi::c_int = 12;

/// `CU_STREAM_LEGACY`: the legacy default stream, whatever the calling thread's default.
pub const CU_STREAM_LEGACY: usize = 0x1;
/// `CU_STREAM_NON_BLOCKING`: a stream that does not synchronize with the legacy stream.
pub const CU_STREAM_NON_BLOCKING: u32 = 0x1;
/// `CU_EVENT_DISABLE_TIMING`.
pub const CU_EVENT_DISABLE_TIMING: u32 = 0x2;

/// `CU_GET_PROC_ADDRESS_*` flag: the per-thread-default-stream (`_ptsz`/`_ptds`) variants.
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// `CU_STREAM_PER_THREAD`: the calling thread's per-thread default stream.
pub const CU_STREAM_PER_THREAD: usize = 0x2;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`: a thread in this mode may make calls a capture elsewhere
/// would forbid it.
pub const CU_STREAM_CAPTURE_MODE_RELAXED: std::ffi::c_int = 2;
/// `CU_STREAM_CAPTURE_STATUS_ACTIVE`.
pub const CU_STREAM_CAPTURE_STATUS_ACTIVE: std::ffi::c_int = 1;

/// `CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE`: memory on a device (the others are host).
pub const CU_MEM_LOCATION_TYPE_DEVICE: std::ffi::c_int = 1;
/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`: device memory a driver pool holds now.
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: std::ffi::c_int = 5;
/// `CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH`: the most it held since the high was last reset.
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: std::ffi::c_int = 6;
/// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT`: bytes of a driver pool handed out and not yet freed.
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: std::ffi::c_int = 7;
/// `CU_MEMPOOL_ATTR_USED_MEM_HIGH`: the most handed out at once since the high was reset.
pub const CU_MEMPOOL_ATTR_USED_MEM_HIGH: std::ffi::c_int = 8;
/// `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`: device memory the driver holds for graphs' memory
/// nodes now (`cuDeviceGetGraphMemAttribute`).
pub const CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: std::ffi::c_int = 2;
/// `CU_GRAPH_NODE_TYPE_MEM_ALLOC`: a graph's memory allocation node.
pub const CU_GRAPH_NODE_TYPE_MEM_ALLOC: std::ffi::c_int = 10;
/// `CUDA_ARRAY3D_DEFERRED_MAPPING`: an array created without memory (to ask its footprint).
pub const CUDA_ARRAY3D_DEFERRED_MAPPING: std::ffi::c_uint = 0x80;

/// `CUmemGenericAllocationHandle`: physical memory from `cuMemCreate`.
pub type MemHandle = u64;
/// `CUmemoryPool`, `CUarray`, `CUmipmappedArray`: opaque driver handles.
pub type Opaque = *mut std::ffi::c_void;

/// The leading fields of `CUmemAllocationProp` and `CUmemPoolProps` (identical up to here):
/// where the memory lives. The hooks only read them.
#[repr(C)]
pub struct MemPropHead {
    pub kind: std::ffi::c_int,
    pub handle_types: std::ffi::c_int,
    pub location_type: std::ffi::c_int,
    pub location_id: std::ffi::c_int,
}

/// `CUmemAllocationProp`: pinned device memory of one device, no shareable handle.
#[repr(C)]
pub struct MemAllocProp {
    head: MemPropHead,
    win32_metadata: *mut std::ffi::c_void,
    /// `allocFlags`: compression type, GPUDirect RDMA capable, usage, reserved.
    alloc_flags: [u8; 8],
}

/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
const CU_MEM_ALLOCATION_TYPE_PINNED: std::ffi::c_int = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: std::ffi::c_int = 3;

impl MemAllocProp {
    pub fn device(dev: CUdevice) -> Self {
        MemAllocProp {
            head: MemPropHead {
                kind: CU_MEM_ALLOCATION_TYPE_PINNED,
                handle_types: 0,
                location_type: CU_MEM_LOCATION_TYPE_DEVICE,
                location_id: dev,
            },
            win32_metadata: std::ptr::null_mut(),
            alloc_flags: [0; 8],
        }
    }

    /// As [`device`](Self::device), and exportable as a POSIX file descriptor
    /// (`cuMemExportToShareableHandle`: how a block of an expandable segment crosses processes).
    pub fn exportable(dev: CUdevice) -> Self {
        let mut p = Self::device(dev);
        p.head.handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        p
    }

    /// As `cuMemCreate` takes it.
    pub fn head(&self) -> *const MemPropHead {
        &self.head
    }

    /// As `cuMemGetAllocationPropertiesFromHandle` fills it.
    pub fn head_mut(&mut self) -> *mut MemAllocProp {
        self
    }

    /// The device whose memory this is (`None`: not device memory).
    pub fn device_id(&self) -> Option<CUdevice> {
        (self.head.location_type == CU_MEM_LOCATION_TYPE_DEVICE).then_some(self.head.location_id)
    }
}

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
pub const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: std::ffi::c_int = 1;

/// A program's own `CUmemAllocationProp`, kept as its bytes: what `cuMemCreate` needs to make
/// the same kind of memory again (a sleep's wake).
#[derive(Clone, Copy)]
#[repr(C, align(8))]
pub struct PropBytes([u8; std::mem::size_of::<MemAllocProp>()]);

impl PropBytes {
    /// A copy of the properties at `p`.
    ///
    /// # Safety
    /// `p` is valid for reads of a whole `CUmemAllocationProp` (`cuMemCreate`'s contract).
    pub unsafe fn read(p: *const MemPropHead) -> PropBytes {
        let mut out = PropBytes([0; std::mem::size_of::<MemAllocProp>()]);
        // SAFETY: the caller's contract; `out` is a distinct local of exactly that size.
        unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), out.0.as_mut_ptr(), out.0.len()) };
        out
    }

    fn int(&self, at: usize) -> std::ffi::c_int {
        std::ffi::c_int::from_ne_bytes(self.0[at..at + 4].try_into().expect("4 bytes"))
    }

    /// Shareable handle types asked (`requestedHandleTypes`; 0: none).
    pub fn handle_types(&self) -> std::ffi::c_int {
        self.int(4)
    }

    /// The device whose memory this is (`None`: not device memory).
    pub fn device_id(&self) -> Option<CUdevice> {
        (self.int(8) == CU_MEM_LOCATION_TYPE_DEVICE).then(|| self.int(12))
    }

    /// `allocFlags.usage` (0: plain memory; else, e.g., a sparse arrays' tile pool).
    pub fn usage(&self) -> u16 {
        u16::from_ne_bytes([self.0[26], self.0[27]])
    }

    /// As `cuMemCreate` takes it.
    pub fn as_ptr(&self) -> *const MemPropHead {
        self.0.as_ptr().cast()
    }
}

/// `CUmemLocation`: a device, for `cuMemGetAccess`.
#[repr(C)]
pub struct MemLocation {
    location_type: std::ffi::c_int,
    location_id: std::ffi::c_int,
}

impl MemLocation {
    pub fn device(dev: CUdevice) -> Self {
        MemLocation {
            location_type: CU_MEM_LOCATION_TYPE_DEVICE,
            location_id: dev,
        }
    }
}

/// `CUmemAccessDesc`: who may touch mapped memory, and how.
#[repr(C)]
pub struct MemAccessDesc {
    location_type: std::ffi::c_int,
    location_id: std::ffi::c_int,
    flags: std::ffi::c_int,
}

impl MemAccessDesc {
    pub fn read_write(dev: CUdevice) -> Self {
        Self::new(dev, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
    }

    /// `dev` with access `flags` (`CUmemAccess_flags`).
    pub fn new(dev: CUdevice, flags: std::ffi::c_int) -> Self {
        MemAccessDesc {
            location_type: CU_MEM_LOCATION_TYPE_DEVICE,
            location_id: dev,
            flags,
        }
    }
}

/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`, as `cuMemGetAccess` answers it.
pub const ACCESS_READ_WRITE: u64 = CU_MEM_ACCESS_FLAGS_PROT_READWRITE as u64;

/// `CUDA_ARRAY_DESCRIPTOR` (the `_v2` entry points).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ArrayDesc {
    pub width: usize,
    pub height: usize,
    pub format: std::ffi::c_uint,
    pub channels: std::ffi::c_uint,
}

/// `CUDA_ARRAY_DESCRIPTOR_v1` (legacy `cuArrayCreate`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ArrayDescV1 {
    pub width: std::ffi::c_uint,
    pub height: std::ffi::c_uint,
    pub format: std::ffi::c_uint,
    pub channels: std::ffi::c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (the `_v2` entry points and `cuMipmappedArrayCreate`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Array3DDesc {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: std::ffi::c_uint,
    pub channels: std::ffi::c_uint,
    pub flags: std::ffi::c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR_v1` (legacy `cuArray3DCreate`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Array3DDescV1 {
    pub width: std::ffi::c_uint,
    pub height: std::ffi::c_uint,
    pub depth: std::ffi::c_uint,
    pub format: std::ffi::c_uint,
    pub channels: std::ffi::c_uint,
    pub flags: std::ffi::c_uint,
}

/// `CUDA_ARRAY_MEMORY_REQUIREMENTS`.
#[repr(C)]
#[derive(Default)]
pub struct ArrayMemReq {
    pub size: usize,
    pub alignment: usize,
    pub reserved: [std::ffi::c_uint; 4],
}

impl From<ArrayDesc> for Array3DDesc {
    fn from(d: ArrayDesc) -> Self {
        Array3DDesc {
            width: d.width,
            height: d.height,
            depth: 0,
            format: d.format,
            channels: d.channels,
            flags: 0,
        }
    }
}

impl From<ArrayDescV1> for Array3DDesc {
    fn from(d: ArrayDescV1) -> Self {
        Array3DDesc {
            width: d.width as usize,
            height: d.height as usize,
            depth: 0,
            format: d.format,
            channels: d.channels,
            flags: 0,
        }
    }
}

impl From<Array3DDescV1> for Array3DDesc {
    fn from(d: Array3DDescV1) -> Self {
        Array3DDesc {
            width: d.width as usize,
            height: d.height as usize,
            depth: d.depth as usize,
            format: d.format,
            channels: d.channels,
            flags: d.flags,
        }
    }
}

impl Array3DDesc {
    /// Bytes of the texels alone (no alignment, one level): the estimate when the driver
    /// cannot tell the footprint. Formats cudapool does not know count 16 bytes per element.
    pub fn texel_bytes(&self) -> u64 {
        let per_element: u64 = match self.format {
            0x01 | 0x08 => 1,        // (un)signed int8
            0x02 | 0x09 | 0x10 => 2, // (un)signed int16, half
            0x03 | 0x0a | 0x20 => 4, // (un)signed int32, float
            _ => 16,
        };
        let dim = |n: usize| (n as u64).max(1);
        dim(self.width)
            .saturating_mul(dim(self.height))
            .saturating_mul(dim(self.depth))
            .saturating_mul(per_element)
            .saturating_mul(self.channels.max(1) as u64)
    }
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (v1), as `cuGraphMemAllocNodeGetParams` writes it: the pool
/// properties (88 bytes; where the memory lives at their head), the access descriptors, the
/// size and the address. The hooks only read `props` and `bytesize`.
#[repr(C)]
pub struct MemAllocNodeParams {
    pub props: MemPropHead,
    props_rest: [u8; 72],
    access_descs: *const std::ffi::c_void,
    access_desc_count: usize,
    pub bytesize: usize,
    dptr: DevPtr,
    /// Room for fields a later driver might add behind these (never read).
    spare: [u8; 64],
}

impl Default for MemAllocNodeParams {
    fn default() -> Self {
        MemAllocNodeParams {
            props: MemPropHead {
                kind: 0,
                handle_types: 0,
                location_type: 0,
                location_id: 0,
            },
            props_rest: [0; 72],
            access_descs: std::ptr::null(),
            access_desc_count: 0,
            bytesize: 0,
            dptr: 0,
            spare: [0; 64],
        }
    }
}
