//! How long a reader of other processes' files (`cudapool stat`, the exporter) may spend, so
//! that no file and no user can hold it: bounded by time, not by trust (docs/design.md, "What cudapool opens on a shared
//! node").
//!
//! A file nobody holds is read once and never waited on; a file a live process holds is
//! waited on at most [`PER_FILE`]; all the files of one owner together cost at most their
//! share of the read's time; the whole read ends at its deadline and counts what it left.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The most a reader waits on one file a live process is writing.
pub const PER_FILE: Duration = Duration::from_millis(5);
/// The whole read's time unless the caller says (a scrape's answer comes well within the
/// 10 s Prometheus gives it by default).
pub const READ_TIME: Duration = Duration::from_secs(2);

/// One read's clock: its deadline and what each owner's files have cost it.
#[derive(Debug)]
pub struct Patience {
    start: Instant,
    total: Duration,
    /// What one owner's files may cost in all.
    share: Duration,
    spent: HashMap<u32, Duration>,
}

impl Patience {
    /// A read of the files of `owners` users (each gets an equal share of `total`).
    pub fn new(total: Duration, owners: usize) -> Patience {
        Patience {
            start: Instant::now(),
            total,
            share: total / owners.max(1) as u32,
            spent: HashMap::new(),
        }
    }

    fn left(&self) -> Duration {
        self.total.saturating_sub(self.start.elapsed())
    }

    fn owner_left(&self, owner: u32) -> Duration {
        self.share
            .saturating_sub(self.spent.get(&owner).copied().unwrap_or_default())
            .min(self.left())
    }

    /// Whether one more file of `owner`'s may be read.
    pub fn may_read(&self, owner: u32) -> bool {
        !self.owner_left(owner).is_zero()
    }

    /// How long a live file of `owner`'s may be waited on now.
    pub fn wait_for(&self, owner: u32) -> Duration {
        PER_FILE.min(self.owner_left(owner))
    }

    /// Reads one file of `owner`'s with `read` (given how long it may wait) and charges the
    /// time it took to that owner.
    pub fn read<T>(&mut self, owner: u32, read: impl FnOnce(Duration) -> T) -> T {
        let wait = self.wait_for(owner);
        let t0 = Instant::now();
        let out = read(wait);
        *self.spent.entry(owner).or_default() += t0.elapsed();
        out
    }

    /// Why a file was not read: the read's time, or this owner's share of it, ran out.
    pub fn why_not(&self, owner: u32) -> String {
        if self.left().is_zero() {
            format!("not read: the read's {} ms ran out", self.total.as_millis())
        } else {
            format!(
                "not read: user {owner}'s files used their share ({} ms) of the read's time",
                self.share.as_millis()
            )
        }
    }
}

/// Waits up to `wait` for `ready` to say yes, looking every 200 µs: whether it did.
pub fn wait_until(wait: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    loop {
        if ready() {
            return true;
        }
        if t0.elapsed() >= wait {
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_owner_cannot_spend_anothers_share() {
        // Reads of 100 ms against shares of 1 s: a loaded machine's late wake-ups (which made
        // a 40 ms read overrun both shares) stay far inside the other owner's second.
        let mut p = Patience::new(Duration::from_secs(2), 2);
        while p.may_read(1) {
            p.read(1, |_| std::thread::sleep(Duration::from_millis(100)));
        }
        assert!(p.may_read(2), "user 2 still has its share");
        assert!(p.why_not(1).contains("share"));
        let waited = p.read(2, |w| w);
        assert!(waited <= PER_FILE);
    }

    #[test]
    fn a_wait_ends() {
        let t0 = Instant::now();
        assert!(!wait_until(Duration::from_millis(3), || false));
        assert!(t0.elapsed() < Duration::from_millis(100));
        assert!(wait_until(Duration::ZERO, || true));
    }
}
