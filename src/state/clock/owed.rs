//! Fences handed over: what a context owes (the newest fence handed over), how a queue pays
//! it (a device-side wait on its next work), and how a capture begins with nothing owed. Part
//! of the clock (`super`), whose fields it reads.

use super::{Alive, ContextClock, Owed, Zombie, BUSY_CONTEXTS, CLOCKS};
use crate::base::config::Reuse;
use crate::base::cu::*;
use crate::base::flags::{capturing_somewhere, exiting, own_calls};
use crate::base::sync::lock;
use crate::pool::queues::QueueKey;
use crate::pool::FenceId;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

/// A capture is about to begin: every context's owed fence is waited for on the host now, so
/// that no queue has a fence to pay while it lasts (a hand-over is refused meanwhile). Without
/// a permission of `own_calls` (another capture is under way, and it settled them) nothing.
pub fn settle_all_owed() {
    let clocks: Vec<Arc<ContextClock>> = lock(&CLOCKS).iter().filter_map(|w| w.upgrade()).collect();
    for c in clocks {
        if !c.owing.load(SeqCst) {
            continue;
        }
        let Some(calls) = own_calls() else {
            return;
        };
        let Some(alive) = c.alive() else {
            continue;
        };
        for (ev, _hold) in c.owed_events() {
            c.driver.own(&calls).event_synchronize(ev);
        }
        alive.prune_owed();
    }
}

impl ContextClock {
    /// The events of the fence this context owes, if any.
    fn owed_events(&self) -> Vec<(usize, Option<Arc<Zombie>>)> {
        match &lock(&self.owed).fence {
            Some((_, f)) => f
                .own
                .iter()
                .map(|&e| (e, None))
                .chain(f.zombies.iter().map(|z| (z.0, Some(z.clone()))))
                .collect(),
            None => Vec::new(),
        }
    }

    /// This context begins device work while another already has: waits on the host for the
    /// fences the others owe (their blocks may reach this context's queues, which never pay).
    pub(super) fn wait_for_others_owed(&self) {
        let Some(calls) = own_calls() else {
            return;
        };
        let others: Vec<Arc<ContextClock>> = lock(&CLOCKS)
            .iter()
            .filter_map(|w| w.upgrade())
            .filter(|c| !std::ptr::eq(&**c, self))
            .collect();
        for other in others {
            if !other.owing.load(SeqCst) {
                continue;
            }
            let Some(_alive) = other.alive() else {
                continue;
            };
            // The zombies' references are held through the wait: none is destroyed under it.
            for (ev, _hold) in other.owed_events() {
                other.driver.own(&calls).event_synchronize(ev);
            }
        }
    }

    /// [`Clock::hand_over`] (see the module doc).
    pub(super) fn hand_over_now(&self, f: FenceId) -> bool {
        if self.reuse == Reuse::Immediate
            || exiting()
            || !self.trusted()
            || BUSY_CONTEXTS.load(Acquire) > 1
        {
            return false;
        }
        // Held through: no capture begins while a fence is being handed over (one begins with
        // nothing owed, see `settle_all_owed`).
        let Some(calls) = own_calls() else {
            return false;
        };
        let Some(alive) = self.alive() else {
            return false;
        };
        let Some(fence) = lock(&self.fences).remove(&f) else {
            return false;
        };
        let mut owed = lock(&self.owed);
        if owed.fence.as_ref().is_some_and(|(id, _)| *id > f) {
            // An older fence than the one owed: covered by it already.
            lock(&self.spare).extend(fence.own);
            return true;
        }
        owed.gen += 1;
        if let Some((_, older)) = owed.fence.replace((f, fence)) {
            // Covered by the new one (see the module doc). A wait on the host that still
            // holds one of its events only waits longer if it is recorded again.
            lock(&self.spare).extend(older.own);
        }
        self.owing.store(true, SeqCst);
        drop(owed);
        crate::log_at!(
            crate::base::config::LogLevel::Debug,
            "fence {f} handed over: every queue's next work waits for it on the device"
        );
        // Every thread's next work call reports again, and pays: before the block is handed out.
        crate::pool::queues::bump_epoch();
        if BUSY_CONTEXTS.load(SeqCst) > 1 {
            // A second context began meanwhile and may not have seen this fence owed: it is
            // waited for here, on the host.
            for (ev, _hold) in self.owed_events() {
                self.driver.own(&calls).event_synchronize(ev);
            }
        }
        drop(alive);
        true
    }
}

impl Alive<'_> {
    /// Makes `q`'s stream wait for the owed fence if it has not yet (the calling thread is
    /// about to issue work on `q`, which is not capturing: see `Shim::work_on`). The wait is
    /// on the device, on the stream the program issues to: as legal during a capture elsewhere
    /// as the program's own work there. Only if the driver refuses it does the host wait,
    /// which needs a permission of `own_calls`.
    pub(super) fn pay(&self, q: QueueKey) {
        let c = self.clock;
        let d = c.driver;
        let mut owed = lock(&c.owed);
        let gen = owed.gen;
        if owed.waited.get(&q).is_some_and(|&g| g >= gen) || self.settle_owed(&mut owed) {
            return;
        }
        let Some((_, f)) = &owed.fence else {
            return;
        };
        let target = ContextClock::target(q);
        // Whether some event was waited for on the host (the driver refused the device-side
        // wait), and whether one was waited for nowhere (refused on the device, and no host
        // wait allowed during a capture): then the queue still owes it.
        let (on_host, unpaid) = d.in_context(c.ctx, || {
            let (mut on_host, mut unpaid) = (false, false);
            for &ev in f.own.iter().chain(f.zombies.iter().map(|z| &z.0)) {
                let waited = d.wait_before_program_work(target, ev) == CUDA_SUCCESS;
                if !waited {
                    match own_calls() {
                        Some(calls) => {
                            d.own(&calls).event_synchronize(ev);
                            on_host = true;
                        }
                        None => unpaid = true,
                    }
                }
            }
            (on_host, unpaid)
        });
        if unpaid {
            return;
        }
        owed.waited.insert(q, gen);
        crate::log_at!(
            crate::base::config::LogLevel::Debug,
            "queue {target:#x} waits for a handed-over fence ({})",
            if on_host {
                "on the host"
            } else {
                "on the device"
            }
        );
    }

    /// Drops the owed fence if it has completed (its events go back to the spare list);
    /// whether nothing is owed now.
    fn settle_owed(&self, owed: &mut Owed) -> bool {
        let c = self.clock;
        let done = match &owed.fence {
            None => true,
            Some(_) if capturing_somewhere() => false,
            Some((_, f)) => f
                .own
                .iter()
                .chain(f.zombies.iter().map(|z| &z.0))
                .all(|&ev| self.complete(ev)),
        };
        if done {
            if let Some((_, f)) = owed.fence.take() {
                lock(&c.spare).extend(f.own);
            }
            owed.waited.clear();
            c.owing.store(false, Release);
        }
        done
    }

    /// Drops the owed fence if it has completed.
    pub(super) fn prune_owed(&self) {
        if self.clock.owing.load(Acquire) {
            self.settle_owed(&mut lock(&self.clock.owed));
        }
    }
}
