//! The process's part in its group (`CUDAPOOL_GROUP`, `group`): lending its idle cache to a
//! member short of room, asking the others when it is short itself, and the group's figures.

use super::Shim;
use crate::base::cu::CUdevice;
use crate::limits::group::GroupFigures;

impl Shim {
    /// Gives back up to `bytes` of cached memory that is ready now on the GPU `uuid`, waiting
    /// for nothing (another member asked; `group`'s lending thread calls this). Returns the
    /// bytes released.
    pub(crate) fn lend(&self, uuid: &[u8; 16], bytes: u64) -> u64 {
        let mut released = 0;
        for dev in self.budgets.seen() {
            if self.budgets.uuid(dev, self.driver).as_ref() != Some(uuid) {
                continue;
            }
            for (ctx, cp) in self.contexts.on_device(dev) {
                if released >= bytes {
                    break;
                }
                // Its segments go back through its context, only while it lives.
                let Some(_alive) = cp.clock.enter() else {
                    continue;
                };
                let up = self.upstream(dev);
                released += self.in_context(ctx, || cp.pool.release_ready(&up, bytes - released));
            }
            if released > 0 {
                self.event(dev, "lent", released);
            }
        }
        released
    }

    /// `bytes` did not fit on `dev` after this process gave back its own cache: if the group
    /// is what is short (not this process's own limit), asks the other members for their idle
    /// cache and waits a bounded time (`group::LEND_WAIT`). Whether the bytes fit now.
    pub(crate) fn borrow(&self, dev: CUdevice, bytes: u64) -> bool {
        let budget = self.budget(dev);
        let own_room = budget.hard_limit().room(budget.reserved());
        match budget.shared() {
            Some(shared) if own_room >= bytes => shared.borrow(bytes),
            _ => false,
        }
    }

    /// `bytes` did not fit on `dev` even after borrowing: with `CUDAPOOL_SLEEP_IDLE`, asks the
    /// members idle that long to sleep, longest idle first (`group::SLEEP_WAIT` each). Whether
    /// the bytes fit now.
    pub(crate) fn put_idle_to_sleep(&self, dev: CUdevice, bytes: u64) -> bool {
        let Some(idle) = self.config.sleep.idle else {
            return false;
        };
        let budget = self.budget(dev);
        let own_room = budget.hard_limit().room(budget.reserved());
        match budget.shared() {
            Some(shared) if own_room >= bytes => shared.sleep_idle(bytes, idle),
            _ => false,
        }
    }

    /// The group's figures on `dev`: `None` when the process is in no group.
    pub fn group_figures(&self, dev: CUdevice) -> Option<GroupFigures> {
        self.budget(dev);
        self.budgets.share(dev).map(|s| s.figures())
    }

    /// The group's name, if the process is in one.
    pub fn group_name(&self) -> Option<&str> {
        self.config.group.as_deref()
    }
}
