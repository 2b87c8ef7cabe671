//! Where things lie in a ledger file, for the tests and tools that read or edit one from outside
//! as its owner may (`ledger` re-exports these).

use super::door::{door_byte, holder_byte};
use super::{DeviceSlot, Ledger, SIZE};
use std::mem::{offset_of, size_of};

/// How long a ledger file is (for tests and tools that make or check one).
pub fn ledger_bytes() -> usize {
    SIZE
}

/// Where the ledger's sequence word lies in the file (for the tests that plant one left odd).
pub fn seq_offset() -> usize {
    offset_of!(Ledger, seq)
}

/// Where a member's liveness byte lies in the file (for tests that hold one from outside).
pub fn member_byte_offset(i: usize) -> usize {
    SIZE + i
}

/// Where the door's lock byte lies in the file (for the tests that hold it as a stopped joiner
/// would), and where its `turns` lies (for those that pass it as a crowd would).
pub fn door_offsets() -> (usize, usize) {
    (door_byte() as usize, offset_of!(Ledger, turns))
}

/// Where the byte lies whose classic (process-owned) lock names the door's holder (for the
/// tests that hold the door as a live or a stopped joiner would).
pub fn door_holder_offset() -> usize {
    holder_byte() as usize
}

/// Where a word of GPU slot `slot` lies in the file: `"limit"`, `"total"` (what the members
/// record they hold) or `"used"` (whether the slot is claimed). For the tests that edit them as
/// the file's owner may.
pub fn slot_word_offset(slot: usize, word: &str) -> usize {
    let field = match word {
        "limit" => offset_of!(DeviceSlot, limit),
        "total" => offset_of!(DeviceSlot, total),
        "used" => offset_of!(DeviceSlot, used),
        other => panic!("a GPU slot has no word {other:?}"),
    };
    offset_of!(Ledger, devices) + slot * size_of::<DeviceSlot>() + field
}

/// Where the limit of GPU slot `slot` lies in the file.
pub fn limit_offset(slot: usize) -> usize {
    slot_word_offset(slot, "limit")
}

/// Where the ledger's mutex lies in the file (for the tests that plant a garbage lock word).
pub fn mutex_offset() -> usize {
    offset_of!(Ledger, mutex)
}
