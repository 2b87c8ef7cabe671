//! A member's exit: the last one takes the group's ledger with it.

use super::{ledger, Group};
use crate::base::config::LogLevel::Debug;
use crate::log_at;

impl Group {
    /// At the process's exit: the ledger goes with its last member (it holds nothing then),
    /// behind its door as a reader removes it, so nothing of the group is left in the runtime
    /// folder. A job's ledger stays for its Epilog; one whose last member was killed is removed
    /// by the next reader or rebuilt by the next joiner. Whether it was removed.
    pub fn leave(&self) -> bool {
        use std::os::fd::AsRawFd;
        let Some(dir) = &self.dir else {
            return false;
        };
        let Ok(st) = crate::base::rundir::fstat(self.map.fd.as_raw_fd()) else {
            return false;
        };
        let fname = ledger::file_name(&self.name);
        let gone = ledger::remove_if_dead(dir, &fname, &self.map.fd, &st);
        if gone {
            log_at!(
                Debug,
                "group {}: its last member, removed its ledger",
                self.name
            );
        }
        gone
    }
}
