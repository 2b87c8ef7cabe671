//! A caching pool's sleep and wake: its core's memory handed to the shim's copies under one
//! hold of the pool, and each handle's record (mapped or asleep) written by the core.

use super::CachingPool;
use crate::base::cu::CUresult;
use crate::pool::types::{Asleep, Pool, Restore, Save, Upstream};

impl CachingPool {
    /// See [`Pool::sleep`]: free segments given back first, then the core's mapped memory
    /// handed to `save` under one hold of the pool, and what it put to sleep recorded.
    pub(super) fn sleep_arena(&self, up: &dyn Upstream, save: &mut Save<'_>) -> Result<(), String> {
        self.trim(up, u64::MAX);
        let mut st = self.lock();
        if st.forgotten {
            return Ok(());
        }
        let Some(memory) = st.core.sleeping() else {
            return Ok(());
        };
        let mapped = memory.awake_memory().ok_or(
            "memory of the expandable segment is mapped twice (a release failed); try again after `cudapool_reclaim`",
        )?;
        let mut asleep = Vec::new();
        let r = save(&mapped, &mut asleep);
        for (at, a) in asleep {
            memory.fell_asleep(at, a);
        }
        drop(st);
        self.validate_after("a sleep", true);
        r
    }

    /// See [`Pool::wake`]: the core's asleep handles handed to `restore` under one hold of the
    /// pool; mapped again in the records when it succeeds.
    pub(super) fn wake_arena(
        &self,
        restore: &mut Restore<'_>,
    ) -> Result<Vec<(u64, Asleep)>, CUresult> {
        let mut st = self.lock();
        if st.forgotten {
            return Ok(Vec::new());
        }
        let Some(memory) = st.core.sleeping() else {
            return Ok(Vec::new());
        };
        let asleep = memory.asleep();
        if asleep.is_empty() {
            return Ok(Vec::new());
        }
        restore(&asleep)?;
        let woke = memory.woke();
        drop(st);
        self.validate_after("a wake", true);
        Ok(woke)
    }
}
