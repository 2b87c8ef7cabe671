//! The mapped imports' tables the shim holds.

use crate::base::cu::*;
use crate::state::ipc::HandleBytes;
use std::sync::Mutex;

/// The imports of mapped blocks in this process.
///
/// Invariant: `opened` holds each address handed to the program with the mapping behind it
/// (its handle, range and handle sizes) and how many opens returned it; `by_handle` maps each
/// such handle to that address. A mapping is unmapped when its count reaches zero.
#[derive(Default)]
pub struct MappedImports {
    pub(super) inner: Mutex<MappedTables>,
}

#[derive(Default)]
pub(super) struct MappedTables {
    pub(super) opened: std::collections::HashMap<DevPtr, Opened>,
    pub(super) by_handle: std::collections::HashMap<HandleBytes, DevPtr>,
}

pub(super) struct Opened {
    pub(super) handle: HandleBytes,
    pub(super) base: DevPtr,
    pub(super) bytes: u64,
    pub(super) sizes: Vec<u64>,
    pub(super) refs: u32,
}
