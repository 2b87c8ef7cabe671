//! Locks that outlive a panic. Every hook runs inside a panic boundary, so a panic while a lock
//! is held poisons it; cudapool's state stays usable after such a panic (each structure keeps
//! its invariants between statements that can panic), and the program must not lose every later
//! allocation to a poisoned lock.
//!
//! Uses: nothing of the crate.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking the guard from a poisoned lock as from a clean one.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
