//! Streams and the work the hooks report: what reuse safety's clocks are told (a stream made
//! or destroyed, the queue of each piece of device work).

use super::clock;
use super::Shim;
use crate::base::cu::*;

impl Shim {
    /// Whether the work hooks report queues: reuse is `auto` and the pool caches.
    pub fn watches_work(&self) -> bool {
        self.config.reuse == crate::base::config::Reuse::Auto
            && self.config.pool != crate::base::config::PoolKind::None
    }

    /// Device work is about to be issued on `stream` (as the program passed it; `ptsz` for a
    /// per-thread entry point). Lock-free while this thread keeps to queues it reported since
    /// the epoch last changed; else the queue is reported to its context's clock, which orders
    /// a new queue after the others (see `queues`). Work being captured into a graph is not
    /// work yet: its graph's launch is.
    pub fn work_on(&self, stream: usize, ptsz: bool) {
        let stream = clock::resolve(stream, ptsz);
        let implicit = stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD;
        let ctx = if implicit {
            match self.driver.current_context() {
                Ok(Some(c)) => c as usize,
                _ => return,
            }
        } else {
            0
        };
        if crate::pool::queues::seen(stream, ctx) {
            return;
        }
        let at = crate::pool::queues::epoch();
        if clock::capturing(self.driver, stream) {
            return;
        }
        let key = clock::key(stream);
        let reported = self.in_stream_context(stream, || {
            self.with_current_pool(|_, cp, _| cp.clock.work_on(key))
        });
        if reported.is_ok() {
            crate::pool::queues::remember(stream, ctx, at);
        }
    }

    /// The program is about to begin a graph capture: nothing a capture forbids may be left
    /// for it to meet (see `clock::settle_all_owed`).
    pub fn before_capture(&self) {
        clock::settle_all_owed();
    }

    /// The program created `stream` (a handle, as an address) with `flags` in the current
    /// context.
    pub fn stream_created(&self, stream: usize, flags: u32) {
        if let Ok((ctx, dev)) = self.current() {
            self.context_pool(ctx, dev)
                .clock
                .stream_created(stream, flags);
        }
    }

    /// The program is about to destroy `stream` (a handle, as an address).
    pub fn stream_destroying(&self, stream: usize) {
        if stream == 0 || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD {
            return; // not a stream anyone can destroy: the driver refuses it
        }
        let Some(ctx) = self.driver.context_of_stream(stream) else {
            return;
        };
        if let Some(cp) = self.contexts.get(ctx) {
            cp.clock.stream_destroying(stream);
        }
    }
}
