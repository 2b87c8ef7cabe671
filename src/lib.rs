//! cudapool: preloaded into an unmodified CUDA program, it routes every device allocation
//! through a pool with per-device memory limits and statistics.
//!
//! Layers, top to bottom (each file may only use the ones below it):
//! - [`interpose`]: how calls arrive (overridden `dlsym`, `cuGetProcAddress` wrappers);
//! - [`hooks`]: the exported `cu*` C ABI, panic boundary, re-entry guard;
//! - [`shim`]: process state: contexts, their pools, the live table, OOM handling;
//! - [`streams`]: each context's streams and the events that fence reuse (driver side);
//! - [`pool`]: pool kinds, pure Rust, generic over an upstream;
//! - [`budget`]: per-device limits and counters;
//! - [`driver`]: the real `libcuda.so.1`.
//!
//! Beside them: [`config`] (environment), [`capi`] (`cudapool_*`), [`report`] (status text),
//! [`log`] (stderr lines), [`cu`] (driver types and codes), [`publish`] (live stats for
//! `cudapool stat`), [`trace`] (`CUDAPOOL_TRACE`).

pub mod addr_hash;
pub mod budget;
pub mod capi;
pub mod config;
pub mod counted;
pub mod cu;
pub mod driver;
pub mod hooks;
pub mod interpose;
pub mod log;
pub mod pool;
pub mod publish;
pub mod queues;
pub mod report;
pub mod shim;
pub mod streams;
pub mod striped;
pub mod trace;
pub mod work;

/// Reads the environment when the library loads (SPEC.md: later changes have no effect).
/// Prints nothing and touches no driver: a process that never calls CUDA is not disturbed.
#[ctor::ctor]
unsafe fn load() {
    let _ = shim::config();
}
