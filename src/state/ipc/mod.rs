//! Legacy IPC of pooled blocks: `cuIpcGetMemHandle` in the exporting process,
//! `cuIpcOpenMemHandle` and `cuIpcCloseMemHandle` in the importing one.
//!
//! A legacy handle names a whole driver allocation, and the importer's open maps it from its
//! start. A pooled block is the program's allocation (`state::ranges`), often inside a segment
//! it shares with other blocks. Programs export the block (Numba: the start that
//! `cuMemGetAddressRange` gives; PyTorch: its own segment, here a block; vLLM: the
//! `RANGE_START_ADDR` attribute) and add their offsets to what the importer's open returns, so
//! the importer must get the block's address, not the segment's.
//!
//! So a block further into its segment is exported as the driver's handle of the segment with
//! the block's offset written into the handle's last 8 bytes ([`TAG`] in the top 16 bits, the
//! offset below). The driver leaves those bytes zero in every handle it makes and ignores them
//! when opening (measured: H100, driver 580; an export whose bytes are not zero is refused
//! rather than overwritten). The importer's cudapool takes the tag out, opens the driver's own
//! handle once per segment and hands out the segment's address plus the offset; closes are
//! counted per segment. A block that starts its segment exports the driver's handle unchanged.
//! An importer that does not run cudapool maps the segment's start, so both sides must run
//! under it (processes the program starts inherit `LD_PRELOAD`). Blocks of expandable
//! segments have no driver allocation: their export is `state::ipc_mapped`'s.

mod tables;
use super::Shim;
use crate::base::config::LogLevel::Debug;
use crate::base::cu::*;
use crate::base::sync::lock;
use crate::log_at;
pub use tables::{HandleBytes, Imports};

/// The top 16 bits of a tagged handle's last 8 bytes.
const TAG: u64 = 0xc0de << 48;
/// Offsets below this fit beside the tag.
const MAX_OFFSET: u64 = 1 << 48;
/// Where the tag lives in the handle's 64 bytes.
const TAIL: std::ops::Range<usize> = 56..64;

/// Set once the program exported a block of an expandable segment: pools made later keep to
/// classic segments too.
static CLASSIC_ONLY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether pools may grow expandable segments (no block of one was exported yet).
pub fn may_expand() -> bool {
    !CLASSIC_ONLY.load(std::sync::atomic::Ordering::Relaxed)
}

/// How an export goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Export {
    /// Not inside a pooled block, or a block that starts its segment: the driver's handle.
    Driver,
    /// A block this far into its segment: the driver's handle of the segment, tagged.
    Tagged(u64),
    /// Pooled memory the program does not hold: the driver's answer for an address that is not
    /// allocated.
    NotAllocated,
    /// A block of an expandable segment: mapped memory has no driver handle; this handle
    /// shares its chunks (`state::ipc_mapped`).
    Mapped(HandleBytes),
    /// A block of an expandable segment that cannot be shared (the error to return); from
    /// then on every pool of the process serves large requests from classic segments, so that
    /// blocks allocated later can be exported.
    Refused(CUresult),
}

/// The driver's handle and the offset inside a tagged handle; `None` for any other handle.
pub fn untag(handle: &HandleBytes) -> Option<(HandleBytes, u64)> {
    let tail = u64::from_le_bytes(handle[TAIL].try_into().expect("8 bytes"));
    if tail & !(MAX_OFFSET - 1) != TAG {
        return None;
    }
    let mut clean = *handle;
    clean[TAIL].fill(0);
    Some((clean, tail & (MAX_OFFSET - 1)))
}

/// Writes `offset` into the driver's `handle`; `false` (nothing written) when its last bytes
/// are not free or the offset does not fit.
pub fn tag(handle: &mut HandleBytes, offset: u64) -> bool {
    if handle[TAIL].iter().any(|&b| b != 0) || offset == 0 || offset >= MAX_OFFSET {
        return false;
    }
    handle[TAIL].copy_from_slice(&(TAG | offset).to_le_bytes());
    true
}

impl Shim {
    /// How `cuIpcGetMemHandle(ptr)` goes (see the module's notes).
    pub fn ipc_export(&self, ptr: DevPtr) -> Export {
        match self.held_block(ptr) {
            None => Export::Driver,
            Some(None) => Export::NotAllocated,
            Some(Some((s, _))) if s.expandable => match self.export_mapped(&s) {
                Ok(h) => Export::Mapped(h),
                Err(e) => {
                    self.stop_expanding();
                    Export::Refused(e)
                }
            },
            Some(Some((s, _))) if s.ptr == s.segment => Export::Driver,
            Some(Some((s, _))) => Export::Tagged(s.ptr - s.segment),
        }
    }

    /// The program exports blocks through legacy IPC: no pool grows expandable segments any more.
    fn stop_expanding(&self) {
        if !CLASSIC_ONLY.swap(true, std::sync::atomic::Ordering::Relaxed) {
            log_at!(
                crate::base::config::LogLevel::Warn,
                "cuIpcGetMemHandle of a block in an expandable segment could not share it; large blocks come from classic segments from now on"
            );
        }
        for (_, cp) in self.contexts.on_device(-1) {
            cp.pool.stop_expanding();
        }
    }

    /// `cuIpcOpenMemHandle` of a tagged handle: `open` is the driver's open of the segment's
    /// own handle, called only when this process has not opened it yet. Returns the block's
    /// address. The offset is checked against the size the driver reports for the segment it
    /// opened: a handle that names a place outside it (forged, or damaged) is refused with
    /// `CUDA_ERROR_INVALID_VALUE` and one line, and never hands out an address.
    pub fn ipc_open_tagged(
        &self,
        clean: HandleBytes,
        offset: u64,
        open: impl FnOnce(&HandleBytes) -> Result<DevPtr, CUresult>,
    ) -> Result<DevPtr, CUresult> {
        let mut t = lock(&self.imports.inner);
        let (base, size) = match t.segments.get(&clean) {
            Some(&(base, size, _)) => (base, size),
            None => {
                let base = open(&clean)?;
                let size = match self.driver.address_range(base) {
                    Ok((start, size)) if start == base => size,
                    _ => 0,
                };
                t.segments.insert(clean, (base, size, 0));
                (base, size)
            }
        };
        if offset >= size {
            log_at!(
                crate::base::config::LogLevel::Warn,
                "cuIpcOpenMemHandle: the handle names offset {offset:#x} in an allocation of {size:#x} bytes: refused (a forged or damaged handle)"
            );
            if t.segments.get(&clean).is_some_and(|s| s.2 == 0) {
                t.segments.remove(&clean);
                let _ = self.driver.ipc_close(base);
            }
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        t.segments.get_mut(&clean).expect("just found or made").2 += 1;
        let at = base + offset;
        t.opened.entry(at).or_insert((clean, 0)).1 += 1;
        log_at!(Debug, "ipc open: segment {base:#x} + {offset:#x}");
        Ok(at)
    }

    /// `cuIpcCloseMemHandle(ptr)`: `None` when `ptr` did not come from a tagged open (the
    /// driver closes it); else the result of closing it, with `close` (the driver's close of
    /// the segment) called when the last open of the segment is closed.
    pub fn ipc_close(
        &self,
        ptr: DevPtr,
        close: impl FnOnce(DevPtr) -> CUresult,
    ) -> Option<CUresult> {
        let mut t = lock(&self.imports.inner);
        let (clean, refs) = t.opened.get_mut(&ptr)?;
        let clean = *clean;
        *refs -= 1;
        if *refs == 0 {
            t.opened.remove(&ptr);
        }
        let (base, _, seg_refs) = t
            .segments
            .get_mut(&clean)
            .expect("every open names a segment");
        *seg_refs -= 1;
        if *seg_refs > 0 {
            return Some(CUDA_SUCCESS);
        }
        let base = *base;
        t.segments.remove(&clean);
        Some(close(base))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_round_trips_and_only_where_the_driver_left_zeros() {
        let mut h = [7u8; 64];
        h[TAIL].fill(0);
        let driver = h;
        assert!(untag(&driver).is_none());
        assert!(tag(&mut h, 0x1234_5600));
        assert_ne!(h, driver);
        assert_eq!(untag(&h), Some((driver, 0x1234_5600)));
        // Nothing is written over bytes the driver used, nor for an offset of 0 or too large.
        let mut used = [1u8; 64];
        assert!(!tag(&mut used, 512));
        assert_eq!(used, [1u8; 64]);
        let mut z = driver;
        assert!(!tag(&mut z, 0) && !tag(&mut z, MAX_OFFSET));
        assert_eq!(z, driver);
    }
}
