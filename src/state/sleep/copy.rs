//! Moving a sleep's bytes between the device and the host copy: on up to [`WORKERS`] threads,
//! each with a stream and a pinned slot of its own, so that one thread's transfer over the bus
//! overlaps another's copy between its pinned slot and the (pageable) host copy. A transfer
//! from pageable memory runs at a fraction of the bus's speed (1.5 GB/s against 55 pinned, H200),
//! and pinning the whole host copy costs more than the transfer itself (7 s for 20 GiB).

use crate::base::cu::*;
use crate::base::sync::lock;
use crate::driver::{Driver, Pinned};
use std::sync::Mutex;

/// Threads that move bytes at once, at most.
const WORKERS: usize = 16;
/// Each of a worker's two pinned slots: the most one transfer moves.
const SLOT: usize = 4 << 20;

/// A worker's two pinned slots: while the bus fills (or drains) one, the worker copies the other.
/// Kept for the process once made (`Sleep::staging`: at most [`WORKERS`] pairs, 128 MiB).
pub(in crate::state) struct Slots([Pinned<'static>; 2]);

/// Which way the bytes go.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Way {
    ToHost,
    ToDevice,
}

/// One transfer: a device address, where its bytes are on the host, bytes (at most [`SLOT`]).
#[derive(Clone, Copy)]
struct Piece {
    dev: DevPtr,
    host: *mut u8,
    len: usize,
}

/// The pieces, shared by the workers: each touches only its own pieces' host bytes.
#[derive(Clone, Copy)]
struct Pieces<'a>(&'a [Piece]);
// SAFETY: the workers write (or read) disjoint host ranges, which outlive them (they are scoped
// threads of the caller, who holds the memory: `move_parts`).
unsafe impl Send for Pieces<'_> {}
// SAFETY: as above.
unsafe impl Sync for Pieces<'_> {}

/// Moves every part (device address, where its bytes are on the host, bytes) between the
/// device and the host, in context `ctx`.
///
/// # Safety
/// Each part's host pointer is valid for reads and writes of its bytes, the parts' host ranges
/// do not overlap, and nothing else uses them until this returns.
pub(super) unsafe fn move_parts(
    driver: &'static Driver,
    staging: &Mutex<Vec<Slots>>,
    ctx: usize,
    parts: &[(DevPtr, *mut u8, u64)],
    way: Way,
) -> Result<(), CUresult> {
    let mut pieces = Vec::new();
    for &(p, h, n) in parts {
        let n = n as usize;
        let mut done = 0;
        while done < n {
            let len = (n - done).min(SLOT);
            pieces.push(Piece {
                dev: p + done as u64,
                // SAFETY: inside the part's host range (the caller's contract).
                host: unsafe { h.add(done) },
                len,
            });
            done += len;
        }
    }
    if pieces.is_empty() {
        return Ok(());
    }
    let cores = std::thread::available_parallelism().map_or(WORKERS, |n| n.get());
    let workers = WORKERS.min(cores).min(pieces.len());
    let pieces = Pieces(&pieces);
    std::thread::scope(|scope| {
        let running: Vec<_> = (0..workers)
            .map(|w| {
                scope.spawn(move || {
                    driver.in_context(ctx, || {
                        driver.relaxed(|| {
                            let slots = match lock(staging).pop() {
                                Some(s) => s,
                                None => Slots([driver.pinned(SLOT)?, driver.pinned(SLOT)?]),
                            };
                            let r = worker(driver, &slots, pieces, w, workers, way);
                            lock(staging).push(slots);
                            r
                        })
                    })
                })
            })
            .collect();
        running
            .into_iter()
            .map(|t| t.join().unwrap_or(Err(CUDA_ERROR_UNKNOWN)))
            .fold(Ok(()), Result::and)
    })
}

/// Worker `w` of `n`: pieces `w`, `w + n`, ... through its two slots, the bus moving one
/// piece while the worker copies the one before (each slot with its own stream).
fn worker(
    driver: &Driver,
    slots: &Slots,
    pieces: Pieces,
    w: usize,
    n: usize,
    way: Way,
) -> Result<(), CUresult> {
    let streams = [driver.own_stream()?, driver.own_stream()?];
    let mine: Vec<&Piece> = pieces.0.iter().skip(w).step_by(n).collect();
    let slot = |k: usize| slots.0[k % 2].as_mut_ptr();
    // The piece whose transfer is queued on stream `k % 2` and not yet waited for.
    let mut queued: [Option<&Piece>; 2] = [None, None];
    let drain = |k: usize, queued: &mut [Option<&Piece>; 2]| -> Result<(), CUresult> {
        if let Some(p) = queued[k % 2].take() {
            streams[k % 2].wait()?;
            if way == Way::ToHost {
                // SAFETY: the transfer into the slot is done; the piece's host bytes are this
                // worker's alone (`move_parts`' contract) and the slot holds p.len <= SLOT.
                unsafe { std::ptr::copy_nonoverlapping(slot(k), p.host, p.len) };
            }
        }
        Ok(())
    };
    for (k, p) in mine.iter().enumerate() {
        // The slot's last transfer is done (and, to the host, copied out) before reuse.
        drain(k, &mut queued)?;
        // SAFETY: the slot is pinned, SLOT >= p.len bytes, and free (drained above); the
        // piece's host bytes are valid and this worker's alone (`move_parts`' contract).
        unsafe {
            match way {
                Way::ToHost => streams[k % 2].to_host(slot(k), p.dev, p.len as u64)?,
                Way::ToDevice => {
                    std::ptr::copy_nonoverlapping(p.host, slot(k), p.len);
                    streams[k % 2].to_device(p.dev, slot(k), p.len as u64)?;
                }
            }
        }
        queued[k % 2] = Some(p);
    }
    drain(mine.len(), &mut queued)?;
    drain(mine.len() + 1, &mut queued)
}
