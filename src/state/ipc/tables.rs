//! The imports' tables the shim holds, and the handle's bytes they are keyed by.

use crate::base::cu::*;
use std::collections::HashMap;
use std::sync::Mutex;

/// The 64 bytes of a `CUipcMemHandle`.
pub type HandleBytes = [u8; 64];

/// The segments this process imported through tagged handles.
///
/// Invariant: `segments` holds each driver handle opened through a tagged handle, with the
/// address the driver's one open gave, the size the driver reports for that allocation, and
/// how many of the program's opens share it;
/// `opened` holds each address handed to the program (segment address plus offset) with the
/// driver handle behind it and how many opens returned it. The counts in `segments` are the
/// sums of those in `opened` that name them.
#[derive(Default)]
pub struct Imports {
    pub(super) inner: Mutex<ImportTables>,
}

#[derive(Default)]
pub(super) struct ImportTables {
    pub(super) segments: HashMap<HandleBytes, (DevPtr, u64, u32)>,
    pub(super) opened: HashMap<DevPtr, (HandleBytes, u32)>,
}
