//! What the shim holds of the overhead: each charge and what took it, and what asks for memory
//! on this thread right now (for the OOM line).

use crate::base::cu::*;
use std::cell::Cell;
use std::ffi::c_int;
use std::sync::Mutex;

/// What took the memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taker {
    /// `cuCtxSetLimit`'s limit (0 stack, 1 printf FIFO, 2 heap) in a context.
    Limit(c_int),
    Module(usize),
    Library(usize),
    /// A context of its own (not a primary one).
    Context,
}

#[derive(Debug)]
pub(super) struct Held {
    pub(super) taker: Taker,
    pub(super) ctx: usize,
    pub(super) dev: CUdevice,
    pub(super) bytes: u64,
}

/// Everything charged as overhead (see the module's notes).
#[derive(Debug, Default)]
pub struct Overhead {
    pub(super) held: Mutex<Vec<Held>>,
    /// Held across a whole `cuCtxSetLimit` (charge, call, record): two threads setting a
    /// limit at once would each charge from the same old figure, and one charge would stay
    /// counted until exit. The call is rare; nothing else takes this lock.
    pub(super) limits: Mutex<()>,
}

thread_local! {
    /// What the allocation being refused on this thread was asked by, for the OOM line.
    pub(super) static ASKING: Cell<Option<&'static str>> = const { Cell::new(None) };
}

/// The name of what asks for memory on this thread right now, if not an allocation.
pub fn asking() -> Option<&'static str> {
    ASKING.with(Cell::get)
}

/// Runs `f` (which may say an OOM line) with `what` named as what asked for the memory.
pub fn asked_by<T>(what: &'static str, f: impl FnOnce() -> T) -> T {
    ASKING.with(|a| a.set(Some(what)));
    let r = f();
    ASKING.with(|a| a.set(None));
    r
}
