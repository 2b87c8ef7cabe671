//! The process state the hooks act on: one [`Shim`] per process, made of parts that each own
//! one concern, and the operations that span them.
//!
//! The parts (types only; none knows the `Shim`): [`budgets`], [`contexts`] (each context's
//! pool), [`live`] (the live table), [`counted`] (the pass-through tables), [`clock`] (the
//! driver side of reuse safety). The `Shim` and its set-up: [`shim`]. Its operations, by
//! concern: [`current`] (the calling thread's pool), [`pooled`] (pooled allocations and the OOM
//! policy), [`ranges`] (what address queries answer about pooled blocks), [`ipc`] (legacy IPC
//! of pooled blocks), [`counting`]
//! (pass-through accounting), [`overhead`] (what the driver takes besides allocations: stack, heap, modules, contexts), [`default_pool`] (what the device's default pool answers), [`graphs`] (graph memory nodes), [`streams`] (streams and the work the
//! hooks report), [`teardown`] (contexts that die, reclaim), [`cache_idle`] (giving back what nothing reuses).
//!
//! Data flow: `hooks` (raw pointers, C ABI) call the safe methods here; these find the calling
//! thread's context and its pool, run the pool against an upstream that charges the device's
//! budget before it asks the real driver, and keep the live table and the pass-through
//! accounting.
//!
//! What this layer may use: the pool, the budget, the queue tracker, the driver, and the base
//! (config, log, flags, types). Reporting sits above it: it reads the state through [`View`]
//! and is told of what happens through the [`Observer`] the crate root installs; nothing here
//! names it.
//!
//! Glossary:
//! - *live table*: every allocation the program holds through the shim, pooled or counted.
//! - *counted*: passed through to the driver (pitched, managed, legacy 32-bit, driver pools,
//!   physical memory, arrays), but charged against the limit and in the stats like pooled
//!   memory.

mod arbiter;
pub mod budgets;
mod cache_idle;
mod captured;
pub mod clock;
pub mod command;
pub mod contexts;
pub mod counted;
mod counting;
mod current;
pub mod default_pool;
mod graphs;
mod groups;
pub mod history;
pub mod ipc;
pub mod ipc_mapped;
mod job_witness;
pub mod live;
pub mod nvml;
pub mod oom;
pub mod overhead;
mod pooled;
mod ranges;
mod released;
mod shim;
pub mod sleep;
mod streams;
pub mod suspend;
mod teardown;

pub use budgets::MAX_DEVICES;
pub use contexts::Contexts;
pub use ipc::{Export as IpcExport, HandleBytes};
pub use live::{Live, Origin};
pub use shim::{config, cuda_seen, env_config, set_observer, view, Observer, Shim, State, View};
