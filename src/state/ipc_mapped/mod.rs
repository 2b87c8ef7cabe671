//! Legacy IPC of blocks in expandable segments: `cuIpcGetMemHandle` of a block whose memory is
//! mapped (no driver allocation behind it, so no driver handle), and the importer's open and
//! close of what it gives.
//!
//! **Export.** The handles (physical allocations) under the block (`[lo, hi)`, whole handles,
//! of whatever sizes the arena made them) are exported as POSIX file descriptors
//! (`cuMemExportToShareableHandle`: the arena creates its handles exportable). A table in a
//! `memfd` lists their numbers and sizes (`base::fds`), and the 64-byte handle carries this
//! process's pid, the table's descriptor and inode, the handles' count and bytes, and the
//! block's offset from `lo`, under a magic word and a checksum. Exports are kept per range (a
//! later block over the same handles shares it) until one of their handles is unmapped: then,
//! under the lock that every unmap takes, the table is invalidated and the descriptors closed
//! *before* the chunk goes (an open descriptor would keep the memory alive).
//!
//! **Import.** The importer's cudapool takes the table with `pidfd_getfd` (the same user and
//! ptrace access are needed, as for PyTorch's expandable segments), checks it on the
//! descriptor, takes each chunk's descriptor in turn, imports and maps it into address space of
//! its own, and only then checks that the table is still valid: a table still valid after the
//! last descriptor was taken listed the right ones. It hands out the range's start plus the
//! offset; opens of the same handle share one mapping, closed with the last
//! `cuIpcCloseMemHandle`. An importer without cudapool hands the handle to the driver, which
//! refuses it (`CUDA_ERROR_INVALID_VALUE`): both sides must run under cudapool.
//!
//! **Limits.** The exporter holds one descriptor per exported chunk; it keeps at most half its
//! descriptor limit (`RLIMIT_NOFILE`) for exports and drops the oldest exports to stay under it
//! (an importer that opens a dropped export gets `CUDA_ERROR_INVALID_VALUE`). A block needing
//! more than that is refused, as is any block when the driver would not create exportable
//! memory; then the pools stop growing expandable segments, so later blocks export through
//! the driver (`state::ipc`).

mod tables;
use super::ipc::HandleBytes;
use super::Shim;
use crate::base::config::LogLevel::{Debug, Warn};
use crate::base::cu::*;
use crate::base::fds::{self, Table};
use crate::base::sync::lock;
use crate::driver::Inside;
use crate::log_at;
use crate::pool::BlockSpan;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;
pub use tables::MappedImports;
use tables::Opened;

/// The handle's first 8 bytes.
const MAGIC: u64 = u64::from_le_bytes(*b"cpmapd02");

/// What a handle of a mapped block carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapped {
    pub pid: u32,
    pub table_fd: i32,
    pub table_ino: u64,
    /// The bytes of all the handles.
    pub span: u64,
    pub count: u32,
    /// The block's start, from the first chunk's.
    pub offset: u64,
    pub size: u64,
}

/// FNV-1a over the handle's first 56 bytes.
fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Mapped {
    pub fn encode(&self) -> HandleBytes {
        let mut h = [0u8; 64];
        h[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        h[8..12].copy_from_slice(&self.pid.to_le_bytes());
        h[12..16].copy_from_slice(&self.table_fd.to_le_bytes());
        h[16..24].copy_from_slice(&self.table_ino.to_le_bytes());
        h[24..32].copy_from_slice(&self.span.to_le_bytes());
        h[32..40].copy_from_slice(&self.offset.to_le_bytes());
        h[40..48].copy_from_slice(&self.size.to_le_bytes());
        h[48..52].copy_from_slice(&self.count.to_le_bytes());
        let sum = checksum(&h[..56]);
        h[56..64].copy_from_slice(&sum.to_le_bytes());
        h
    }

    /// `None`: not a handle of this kind; `Some(Err)`: one, but damaged or inconsistent.
    pub fn decode(h: &HandleBytes) -> Option<Result<Mapped, &'static str>> {
        let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4 bytes"));
        if u64_at(0) != MAGIC {
            return None;
        }
        if u64_at(56) != checksum(&h[..56]) || u32_at(52) != 0 {
            return Some(Err("damaged handle"));
        }
        let m = Mapped {
            pid: u32_at(8),
            table_fd: u32_at(12) as i32,
            table_ino: u64_at(16),
            span: u64_at(24),
            offset: u64_at(32),
            size: u64_at(40),
            count: u32_at(48),
        };
        let fits = m.offset.checked_add(m.size).is_some_and(|e| e <= m.span);
        if m.count == 0 || m.count as u64 > fds::MAX_COUNT || m.size == 0 || !fits {
            return Some(Err("inconsistent handle"));
        }
        Some(Ok(m))
    }
}

/// One export: the handles mapped at `[lo, hi)`.
///
/// Invariant: `_fds[i]` is the exported descriptor of the i-th handle mapped from `lo` on,
/// which is still mapped; `table` lists their numbers and sizes in order and is valid. An
/// export is dropped (its table invalidated, then its descriptors closed) before any of its
/// handles is unmapped ([`while_unmapping`]).
struct Export {
    lo: DevPtr,
    hi: DevPtr,
    count: u64,
    table: Table,
    /// Held, never read: closing them (on drop) lets the chunks' memory go.
    _fds: Vec<OwnedFd>,
}

impl Export {
    fn overlaps(&self, at: DevPtr, bytes: u64) -> bool {
        self.lo < at + bytes && at < self.hi
    }
}

/// This process's exports, oldest first.
static EXPORTS: Mutex<Vec<Export>> = Mutex::new(Vec::new());

/// Runs `unmap` (which unmaps `[at, at + bytes)`) after dropping every export of those chunks,
/// under the exports' lock, so that no export of them can begin until they are gone.
pub fn while_unmapping<T>(at: DevPtr, bytes: u64, unmap: impl FnOnce() -> T) -> T {
    let mut ex = lock(&EXPORTS);
    ex.retain(|e| {
        let gone = e.overlaps(at, bytes);
        if gone {
            e.table.invalidate();
        }
        !gone
    });
    unmap()
}

/// Whether a chunk of `[at, at + bytes)` was exported (another process may map its memory).
pub fn exported(at: DevPtr, bytes: u64) -> bool {
    lock(&EXPORTS).iter().any(|e| e.overlaps(at, bytes))
}

/// How many descriptors exports may hold: half the soft descriptor limit.
fn fd_budget() -> u64 {
    // SAFETY: a zeroed rlimit is a valid out-struct.
    let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0 {
        r.rlim_cur
    } else {
        1024
    };
    (soft / 2).max(16)
}

impl Shim {
    /// The handle of a block of an expandable segment (see the module's notes).
    pub(super) fn export_mapped(&self, span: &BlockSpan) -> Result<HandleBytes, CUresult> {
        let handles = self.contexts.handles_under(span.ptr);
        let (Some(&(lo, _)), Some(&(last, last_len))) = (handles.first(), handles.last()) else {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        };
        let hi = last + last_len;
        let count = handles.len() as u64;
        let budget = fd_budget();
        if count + 1 > budget {
            log_at!(
                Warn,
                "cuIpcGetMemHandle of a {} MiB block of an expandable segment needs {} descriptors, more than the {budget} kept for exports (half of RLIMIT_NOFILE): refused",
                span.size >> 20,
                count + 1
            );
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let mut ex = lock(&EXPORTS);
        let at = match ex.iter().position(|e| e.lo == lo && e.hi == hi) {
            Some(i) => i,
            None => {
                let mut held: u64 = ex.iter().map(|e| e.count + 1).sum();
                while held + count + 1 > budget && !ex.is_empty() {
                    let old = ex.remove(0);
                    old.table.invalidate();
                    held -= old.count + 1;
                }
                let fds = self.driver.vmm_export(&handles)?;
                fds.iter().for_each(fds::cloexec);
                let listed: Vec<(i32, u64)> = fds
                    .iter()
                    .zip(&handles)
                    .map(|(f, &(_, len))| (f.as_raw_fd(), len))
                    .collect();
                let table = Table::new(&listed).map_err(|e| {
                    log_at!(Warn, "cuIpcGetMemHandle: memfd_create failed (errno {e})");
                    CUDA_ERROR_OUT_OF_MEMORY
                })?;
                ex.push(Export {
                    lo,
                    hi,
                    count,
                    table,
                    _fds: fds,
                });
                ex.len() - 1
            }
        };
        let e = &ex[at];
        log_at!(
            Debug,
            "ipc export: block {:#x} over {count} handles at {lo:#x}",
            span.ptr
        );
        Ok(Mapped {
            pid: std::process::id(),
            table_fd: e.table.raw(),
            table_ino: e.table.ino,
            span: hi - lo,
            count: count as u32,
            offset: span.ptr - lo,
            size: span.size,
        }
        .encode())
    }

    /// `cuIpcOpenMemHandle` of `h`: `None` when it is not a handle of a mapped block (the
    /// caller goes on with the other kinds); else the block's address in this process.
    pub fn ipc_open_mapped(&self, h: &HandleBytes) -> Option<Result<DevPtr, CUresult>> {
        let m = match Mapped::decode(h)? {
            Ok(m) => m,
            Err(why) => {
                log_at!(Warn, "cuIpcOpenMemHandle: {why}");
                return Some(Err(CUDA_ERROR_INVALID_VALUE));
            }
        };
        let mut t = lock(&self.mapped_imports.inner);
        if let Some(&at) = t.by_handle.get(h) {
            t.opened.get_mut(&at).expect("by_handle names an open").refs += 1;
            return Some(Ok(at));
        }
        let base = match self.import_mapped(&m) {
            Ok(base) => base,
            Err((code, why)) => {
                log_at!(
                    Warn,
                    "cuIpcOpenMemHandle of a block exported by process {}: {why}",
                    m.pid
                );
                return Some(Err(code));
            }
        };
        let (base, sizes) = base;
        let at = base + m.offset;
        t.opened.insert(
            at,
            Opened {
                handle: *h,
                base,
                bytes: m.span,
                sizes,
                refs: 1,
            },
        );
        t.by_handle.insert(*h, at);
        log_at!(
            Debug,
            "ipc open: {} handles at {base:#x} + {:#x}",
            m.count,
            m.offset
        );
        Some(Ok(at))
    }

    /// Maps the exporter's handles; returns where, and their sizes.
    fn import_mapped(&self, m: &Mapped) -> Result<(DevPtr, Vec<u64>), (CUresult, String)> {
        let take_err = |what: &str, e: i32| {
            let code = match e {
                libc::EPERM | libc::EACCES => CUDA_ERROR_NOT_PERMITTED,
                libc::ENOSYS => CUDA_ERROR_NOT_SUPPORTED,
                _ => CUDA_ERROR_INVALID_VALUE,
            };
            let hint = match e {
                libc::EPERM | libc::EACCES => " (the importer needs ptrace access to the exporter: the same user, and Yama's ptrace_scope 0 unless the exporter is its descendant)",
                libc::ENOSYS => " (pidfd_getfd needs Linux 5.6)",
                libc::ESRCH => " (the exporter has exited)",
                libc::EBADF => " (the exporter freed the block)",
                _ => "",
            };
            (code, format!("{what}: errno {e}{hint}"))
        };
        let pidfd = fds::pidfd_open(m.pid).map_err(|e| take_err("pidfd_open", e))?;
        let table = fds::pidfd_getfd(&pidfd, m.table_fd).map_err(|e| take_err("pidfd_getfd", e))?;
        let listed = fds::read_table(&table, m.table_ino)
            .map_err(|why| (CUDA_ERROR_INVALID_VALUE, why.to_string()))?;
        if listed.span != m.span || listed.fds.len() != m.count as usize {
            return Err((CUDA_ERROR_INVALID_VALUE, "table and handle disagree".into()));
        }
        let sizes: Vec<u64> = listed.fds.iter().map(|&(_, size)| size).collect();
        let align = self
            .driver
            .vmm_granularity(0)
            .unwrap_or(2 << 20)
            .max(2 << 20);
        if sizes.iter().any(|s| s % align != 0) {
            return Err((
                CUDA_ERROR_INVALID_VALUE,
                "table of handles of odd sizes".into(),
            ));
        }
        let base = self
            .driver
            .vmm_import(&sizes, align, |i| {
                fds::pidfd_getfd(&pidfd, listed.fds[i].0).map_err(|_| CUDA_ERROR_INVALID_VALUE)
            })
            .map_err(|e| {
                (
                    e,
                    format!("mapping the exporter's chunks failed (error {e})"),
                )
            })?;
        if !fds::still_valid(&table) {
            let release = self.driver.release_inside(Inside::FailedOpen);
            let _ = release.vmm_unmap_each(base, &sizes);
            let _ = release.vmm_unreserve(base, m.span);
            return Err((
                CUDA_ERROR_INVALID_VALUE,
                "the exporter freed the block while it was being opened".into(),
            ));
        }
        Ok((base, sizes))
    }

    /// `cuIpcCloseMemHandle(ptr)`: `None` when `ptr` did not come from an open of a mapped
    /// block; else the result, the mapping going with its last close (after the device's work
    /// on it: unmapping does not wait).
    pub fn ipc_close_mapped(&self, ptr: DevPtr) -> Option<CUresult> {
        let mut t = lock(&self.mapped_imports.inner);
        let o = t.opened.get_mut(&ptr)?;
        o.refs -= 1;
        if o.refs > 0 {
            return Some(CUDA_SUCCESS);
        }
        // The unmap waits for the device first, which a graph capture forbids: then the
        // close is refused as the driver refuses a synchronizing call, and the mapping stays.
        let Some(calls) = crate::base::flags::own_calls() else {
            o.refs += 1;
            return Some(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        };
        let o = t.opened.remove(&ptr).expect("just found");
        t.by_handle.remove(&o.handle);
        drop(t);
        let own = self.driver.own(&calls);
        let _ = own.synchronize();
        let r = own.release().vmm_unmap_each(o.base, &o.sizes);
        let _ = own.release().vmm_unreserve(o.base, o.bytes);
        Some(r.err().unwrap_or(CUDA_SUCCESS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Mapped {
        Mapped {
            pid: 4242,
            table_fd: 17,
            table_ino: 99,
            span: 6 << 20,
            count: 3,
            offset: 4096,
            size: 5 << 20,
        }
    }

    #[test]
    fn a_handle_round_trips_and_damage_is_caught() {
        let h = sample().encode();
        assert_eq!(Mapped::decode(&h), Some(Ok(sample())));
        // Not ours: a driver handle (no magic).
        assert_eq!(Mapped::decode(&[0u8; 64]), None);
        // Any flipped bit past the magic is caught by the checksum.
        for i in 8..64 {
            let mut d = h;
            d[i] ^= 1;
            assert!(matches!(Mapped::decode(&d), Some(Err(_))), "byte {i}");
        }
        // A block that does not fit its chunks, however well summed.
        let bad = Mapped {
            size: 6 << 20,
            ..sample()
        };
        assert!(matches!(Mapped::decode(&bad.encode()), Some(Err(_))));
        let none = Mapped {
            count: 0,
            ..sample()
        };
        assert!(matches!(Mapped::decode(&none.encode()), Some(Err(_))));
    }
}
