//! cudapool: preloaded into an unmodified CUDA program, it routes every device allocation
//! through a pool with per-device memory limits and statistics.
//!
//! Layers, top to bottom; each module uses only the layers below its own (checked in CI by
//! `scripts/check-layers.py`):
//! 1. the C ABI: [`interpose`] (how calls arrive: overridden `dlsym`, `cuGetProcAddress`
//!    wrappers), [`hooks`] (the exported `cu*` entry points, by family), [`capi`]
//!    (`cudapool_*`);
//! 2. [`report`]: status text, snapshots, the exit report, the trace and the live page; it
//!    reads the state through `state::View` and is its `state::Observer`;
//! 3. [`state`]: the process state: contexts and their pools, the live table, the OOM policy,
//!    pass-through accounting, the driver side of reuse safety;
//! 4. the mechanisms: [`pool`] (pure Rust, generic over an upstream), [`queues`] (which
//!    queues got work), [`budget`] (limits and counters), [`driver`] (the real
//!    `libcuda.so.1`);
//! 5. the base: [`config`], [`log`], [`flags`] (process-wide flags), [`cu`] (driver types),
//!    [`addr_hash`], [`per_thread`], [`sync`] (locks that outlive a panic).
//!
//! This file wires them together: the module tree, and the load-time constructor that reads
//! the environment and installs reporting as the state's observer.

// 1. the C ABI
pub mod capi;
pub mod hooks;
pub mod interpose;
// 2. reporting
pub mod report;
// 3. the process state
pub mod state;
// 4. mechanisms
pub mod budget;
pub mod driver;
pub mod group;
pub mod nvtx;
pub mod pool;
pub mod queues;
// 5. the base
pub mod addr_hash;
pub mod config;
pub mod cu;
pub mod flags;
pub mod frames;
pub mod log;
pub mod per_thread;
pub mod rundir;
pub mod sync;

/// Reads the environment when the library loads (SPEC.md: later changes have no effect).
/// Prints nothing and touches no driver: a process that never calls CUDA is not disturbed.
#[ctor::ctor]
unsafe fn load() {
    let _ = state::config();
    nvtx::init();
    state::set_observer(&report::REPORTING);
}
