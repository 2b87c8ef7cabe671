//! The mandatory mode's check against a fact no member can write. A job's ledger is a file of
//! the job's user: a member can set its GPU's total to 0 and so admit the job's other members
//! past its share (each member enforces the share, but against the totals the ledger records).
//! So at each growth a member also asks what the driver says the job's processes hold on the
//! GPU (NVML's per-process memory, each process placed in its job by its cgroup) and refuses
//! what would take that past the share, with one line.
//!
//! The driver's figure counts each process's whole footprint, the ledger what cudapool counted
//! of it: they differ by what the driver took for a process that cudapool did not see (on an
//! H200 with PyTorch, 92 to 100 MiB a process: modules loaded after its first use of the GPU),
//! and the figure is read outside the ledger's lock, so it may lead it by what a member is
//! mapping at that moment. So it is allowed [`slack`] above the share: a sixty-fourth of the
//! share (at least 2 MiB) and [`PER_PROCESS`] for each process of the job on the GPU. An honest
//! job meets the ledger's refusal first; a forged ledger buys at most that.

use super::{GroupDevice, Locked};
use crate::base::config::LogLevel::Warn;
use crate::log_at;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What the driver says the job's processes hold on the GPU `uuid`: (bytes, processes); `None`
/// when it cannot say (no NVML, a pid namespace it does not see): then the ledger alone decides.
pub trait Witness: Send + Sync {
    fn job_holds(&self, uuid: &[u8; 16]) -> Option<(u64, u64)>;
    /// How the job is named in the line said when it refuses ("job 42").
    fn name(&self) -> String;
}

/// What the driver may hold for a process beyond what cudapool counts of it.
pub const PER_PROCESS: u64 = 128 << 20;

/// How far above the share the driver's figure for `processes` processes may go before a growth
/// is refused.
pub fn slack(share: u64, processes: u64) -> u64 {
    (share / 64)
        .max(2 << 20)
        .saturating_add(PER_PROCESS.saturating_mul(processes))
}

impl GroupDevice {
    /// Checks growths against `w` too (the mandatory mode).
    pub fn witnessed_by(mut self, w: Arc<dyn Witness>) -> GroupDevice {
        self.witness = Some(w);
        self
    }

    /// The driver's figure for the job on this GPU, when a witness is set and can say.
    pub(super) fn witnessed(&self) -> Option<(u64, u64)> {
        self.witness.as_ref()?.job_holds(&self.uuid)
    }

    /// Whether `bytes` more keep the driver's figure `held` within the share (and its
    /// [`slack`]); a refusal is counted in the ledger and said once per process.
    pub(super) fn witness_admits(
        &self,
        l: &mut Locked,
        held: Option<(u64, u64)>,
        bytes: u64,
    ) -> bool {
        let Some((held, processes)) = held else {
            return true;
        };
        let Some(share) = self.group.limit_of(l, self.slot).bytes() else {
            return true;
        };
        if held.saturating_add(bytes) <= share.saturating_add(slack(share, processes)) {
            return true;
        }
        let d = &mut l.devices[self.slot];
        d.refused = d.refused.saturating_add(1);
        static SAID: AtomicBool = AtomicBool::new(false);
        if !SAID.swap(true, Ordering::Relaxed) {
            let who = self.witness.as_ref().map_or(String::new(), |w| w.name());
            log_at!(
                Warn,
                "{who}: the driver says its {processes} processes hold {held} bytes on this GPU, so {bytes} more would pass its share of {share} (its ledger records {}): refused",
                d.total
            );
        }
        false
    }
}
