//! cudapool: preloaded into an unmodified CUDA program, it routes every device allocation
//! through a pool with per-device memory limits and statistics.
//!
//! Layers, top to bottom, one folder each (the tree is the diagram; `docs/design.md` draws it);
//! each module uses only its own layer and the ones below (checked in CI by
//! `scripts/check-layers.py`):
//! 1. [`abi`]: the C ABI: how calls arrive (`interpose`), the exported `cu*` entry points
//!    (`hooks`), the `cudapool_*` C API (`capi`);
//! 2. [`report`]: status text, snapshots, the exit report, the trace and the live page; it
//!    reads the state through `state::View` and is its `state::Observer`;
//! 3. [`state`]: the process state: contexts and their pools, the live table, the OOM policy,
//!    pass-through and graph accounting, the driver side of reuse safety;
//! 4. the mechanisms: [`pool`] (pure Rust, generic over an upstream; and `queues`, which
//!    queues got work), [`limits`] (budgets and groups), [`driver`] (the real `libcuda.so.1`,
//!    and NVTX);
//! 5. [`base`]: configuration, logging, flags, driver types, the runtime directory, support
//!    code.
//!
//! This file wires them together: the module tree, and the load-time constructor that reads
//! the environment and installs reporting as the state's observer.

pub mod abi;
pub mod report;
pub mod state;
// mechanisms
pub mod base;
pub mod driver;
pub mod limits;
pub mod pool;

/// Reads the environment when the library loads (the contract, docs/design.md: later changes have no effect).
/// Prints nothing and touches no driver: a process that never calls CUDA is not disturbed
/// (but for the one `cudapool run --report` started, which says so at exit).
#[ctor::ctor]
unsafe fn load() {
    // On a node that holds jobs to their shares: which job this process runs in, read while
    // descriptors are certain.
    base::job::look_up_at_load();
    if let Ok(config) = state::env_config() {
        report::say_when_unused(config);
        // A stop (Slurm's suspend, Ctrl-Z) gives the GPU memory back first.
        state::suspend::install_at_load(config);
    }
    driver::nvtx::init();
    state::set_observer(&report::REPORTING);
    // A panic inside a hook is said through cudapool's logger, not the standard library's.
    abi::hooks::guard::install_panic_hook();
}
