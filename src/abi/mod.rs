//! The C ABI: everything the program calls. How calls arrive ([`interpose`]: the overridden
//! `dlsym`, the `cuGetProcAddress` wrappers, hook substitution), the exported `cu*` entry
//! points by family ([`hooks`]), and the `cudapool_*` C API ([`capi`]). The top layer: it uses
//! every layer below and nothing uses it.

pub mod capi;
pub mod hooks;
pub mod interpose;
