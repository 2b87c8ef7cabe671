//! How the arena grows: its range reserved on first use, the hole a growth maps, the handles
//! it stitches there near a limit, and the new memory it makes (see the module's notes in
//! `mod.rs`).

use super::super::block::Kind;
use super::{Arena, Blocks, Change, Span};
use crate::base::config::Stitch;
use crate::base::cu::{CUresult, DevPtr, CUDA_ERROR_NOT_SUPPORTED};
use crate::pool::core::{round_up, MIB};
use crate::pool::types::{Upstream, Vmm};

/// `timed!(self, field, expr)`: `expr`, its time added to the growth's `field` under the
/// `stitch-timing` feature (see `timing.rs`); just `expr` otherwise.
macro_rules! timed {
    ($core:expr, $field:ident, $e:expr) => {{
        #[cfg(feature = "stitch-timing")]
        let t = std::time::Instant::now();
        let out = $e;
        #[cfg(feature = "stitch-timing")]
        {
            $core.timing.$field += super::timing::since(t);
        }
        out
    }};
}

/// The range reserved is this many times the device's memory: stitched memory leaves shadows
/// that hold address space (not memory) until the next release.
const SPAN_PER_MEMORY: u64 = 4;
/// A growth stitches only when, after it, less than 1/`STITCH_NEAR_LIMIT` of the limit would be
/// left: a loose limit costs no stitching.
const STITCH_NEAR_LIMIT: u64 = 8;
/// The largest handle a growth makes.
pub const MAX_HANDLE: u64 = 256 * MIB;
/// Under a limit, a handle is at most 1/`HANDLES_PER_REQUEST` of the request that grows the
/// arena: stitching needs handles that lie whole inside the free blocks later requests leave
/// (what other sizes reserve: docs/benchmarks.md, "The pool's constants").
const HANDLES_PER_REQUEST: u64 = 16;
/// Under a limit, a handle is at most 1/`HANDLES_PER_LIMIT` of it.
const HANDLES_PER_LIMIT: u64 = 64;

impl Arena {
    /// The arena's range, reserved on first use (then `true` with it: the caller makes it one
    /// hole); `None` when the upstream has no virtual memory (or refuses the reservation).
    pub(in crate::pool::split) fn reserve(&mut self, up: &dyn Upstream) -> Option<(Span, bool)> {
        if let Some(a) = self.range {
            return Some((a, false));
        }
        let vm = up.virtual_memory()?;
        let Vmm { chunk, span } = vm.vmm()?;
        let span = round_up(span.max(chunk), chunk).saturating_mul(SPAN_PER_MEMORY);
        let base = vm.reserve(span, chunk).ok()?;
        let a = Span { base, span, chunk };
        self.range = Some(a);
        Some((a, true))
    }

    /// The hole to grow at for the rounded request `r` and the bytes it needs mapped: the one
    /// that needs the fewest new chunks (counting the ready free block that ends where it
    /// starts), the lowest such.
    pub(in crate::pool::split) fn best_hole(
        &self,
        blocks: &impl Blocks,
        r: u64,
    ) -> Option<(u64, DevPtr)> {
        let a = self.range?;
        let chunk = a.chunk;
        let mut best: Option<(u64, DevPtr)> = None;
        for (&h, &len) in &self.holes {
            // Only a block of the arena: a classic segment's may end where the arena begins,
            // and the growth never merges with it.
            let before = blocks
                .before(h)
                .filter(|b| b.ready && b.end() == h && b.at >= a.base)
                .map_or(0, |b| b.size);
            let need = round_up(r.saturating_sub(before).max(1), chunk);
            if need <= len && best.is_none_or(|(n, _)| need < n) {
                best = Some((need, h));
            }
        }
        best
    }

    /// Whether a growth of `need` bytes stitches: near a limit (see the module's notes), or
    /// always under `CUDAPOOL_STITCH=always`.
    pub(in crate::pool::split) fn stitches(&self, need: u64, up: &dyn Upstream) -> bool {
        let near = |limit: u64| up.headroom() < need.saturating_add(limit / STITCH_NEAR_LIMIT);
        self.stitch == Stitch::Always || up.limit().bytes().is_some_and(near)
    }

    /// Waits for the device (timed with the growth's other steps).
    pub(in crate::pool::split) fn synchronize(&mut self, up: &dyn Upstream) -> bool {
        timed!(self, sync, up.synchronize())
    }

    /// Stitches handles lying whole inside ready free blocks (the smallest blocks first: the
    /// holes the request did not fit) to `[at, at + need)`, in address order there; the block
    /// that ends at `at` is left alone (the growth extends it). The last handle may reach past
    /// `need` (up to `room`): its memory is held already, and what the request leaves of it
    /// stays free. Returns the bytes stitched and the shadows they leave, for `apply`.
    pub(in crate::pool::split) fn stitch(
        &mut self,
        blocks: &impl Blocks,
        at: DevPtr,
        need: u64,
        room: u64,
        up: &dyn Upstream,
    ) -> (u64, Vec<Change>) {
        let (Some(a), Some(vm)) = (self.range, up.virtual_memory()) else {
            return (0, Vec::new());
        };
        let mut free: Vec<(u64, DevPtr)> = blocks
            .within(a.base, a.end())
            .filter(|b| b.ready && b.end() != at && b.size >= a.chunk)
            .map(|b| (b.size, b.at))
            .collect();
        free.sort_unstable();
        // Everything looked up before the driver is asked: nothing may fail (nor panic)
        // between a mapping and the records of it.
        let mut picked: Vec<(DevPtr, u64)> = Vec::new();
        let mut done = 0;
        'blocks: for (size, p) in free {
            let inside = self
                .mem
                .handles()
                .range(p..p + size)
                .filter(|&(&h, r)| h + r.len <= p + size && !r.asleep());
            for (&h, r) in inside {
                let len = r.len;
                if done + len > room {
                    continue;
                }
                picked.push((h, len));
                done += len;
                if done >= need {
                    break 'blocks;
                }
            }
        }
        let stitched = timed!(self, stitch, vm.stitch(&picked, at)).unwrap_or(0);
        #[cfg(feature = "stitch-timing")]
        {
            self.timing.handles += stitched as u64;
        }
        let mut to = at;
        let mut changes = Vec::new();
        for &(h, len) in &picked[..stitched.min(picked.len())] {
            changes.push(Change {
                at: h,
                len,
                to: Kind::Shadow,
            });
            self.mem.moved(h, to);
            to += len;
        }
        (to - at, changes)
    }

    /// Maps new memory at `[at, at + bytes)` for the rounded request `r`, in handles of
    /// [`handle_sizes`] (at most [`MAX_HANDLE`]; under a limit also 1/[`HANDLES_PER_REQUEST`]
    /// of `r` and 1/[`HANDLES_PER_LIMIT`] of the limit; stitching always, 1/`HANDLES_PER_REQUEST`
    /// of `r` without a limit), a call per run of one size; all or nothing.
    pub(in crate::pool::split) fn map_new(
        &mut self,
        at: DevPtr,
        bytes: u64,
        r: u64,
        up: &dyn Upstream,
    ) -> Result<(), CUresult> {
        timed!(self, map, self.map_handles(at, bytes, r, up))
    }

    fn map_handles(
        &mut self,
        at: DevPtr,
        bytes: u64,
        r: u64,
        up: &dyn Upstream,
    ) -> Result<(), CUresult> {
        if bytes == 0 {
            return Ok(());
        }
        let chunk = self.range.ok_or(CUDA_ERROR_NOT_SUPPORTED)?.chunk;
        let vm = up.virtual_memory().ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
        let cap = match up.limit().bytes() {
            // Stitching at every growth: handles that later holes hold whole.
            None if self.stitch == Stitch::Always => {
                (r / HANDLES_PER_REQUEST).clamp(chunk, MAX_HANDLE)
            }
            // Nothing is stitched: handles as large as the growth allows.
            None => MAX_HANDLE,
            Some(limit) => (limit / HANDLES_PER_LIMIT)
                .min(r / HANDLES_PER_REQUEST)
                .clamp(chunk, MAX_HANDLE),
        };
        let sizes = handle_sizes(bytes, chunk, cap);
        let mut runs: Vec<(DevPtr, u64, u64)> = Vec::new();
        let mut off = at;
        for h in sizes {
            match runs.last_mut() {
                Some(run) if run.2 == h => run.1 += h,
                _ => runs.push((off, h, h)),
            }
            off += h;
        }
        for (i, &(p, len, h)) in runs.iter().enumerate() {
            if let Err(e) = vm.map(p, len, h) {
                for &(p, len, h) in &runs[..i] {
                    let _ = vm.unmap(p, len, h);
                }
                return Err(e);
            }
        }
        for (p, len, h) in runs {
            for s in (p..p + len).step_by(h as usize) {
                self.mem.made(s, h);
            }
        }
        self.mapped += bytes;
        Ok(())
    }

    /// A growth begins (diagnostics: its times are recorded from here).
    #[cfg(feature = "stitch-timing")]
    pub(in crate::pool::split) fn growth_begins(&mut self) {
        self.timing = Default::default();
    }

    /// The growth begun last ended after `ns` nanoseconds (diagnostics).
    #[cfg(feature = "stitch-timing")]
    pub(in crate::pool::split) fn growth_ends(&mut self, ns: u64) {
        self.timing.total = ns;
        super::timing::record(self.timing);
    }
}

/// The handle sizes a growth of `bytes` maps, in order: powers of two times `chunk`, each the
/// largest that fits what is left, at most `cap`.
fn handle_sizes(bytes: u64, chunk: u64, cap: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while rest >= chunk {
        let mut h = chunk;
        while h * 2 <= rest.min(cap) {
            h *= 2;
        }
        out.push(h);
        rest -= h;
    }
    out
}
