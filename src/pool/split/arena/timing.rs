//! Diagnostics of the arena's growths, compiled only with the `stitch-timing` feature (never in
//! a release): each growth's time, the time of its stitch and of its new memory, and every 50
//! growths a line on standard error with their medians and 99th percentiles. What
//! `docs/benchmarks.md` quotes for a stitch's cost on model code was measured with it.

#[cfg(feature = "stitch-timing")]
pub(super) use diagnostics::*;

/// Nothing is timed without the feature.
#[cfg(not(feature = "stitch-timing"))]
#[derive(Clone, Copy, Default)]
pub(super) struct Growth;

#[cfg(feature = "stitch-timing")]
mod diagnostics {
    use std::sync::Mutex;
    use std::time::Instant;

    /// One growth: its whole time, its stitch call's, its new memory's (ns), handles stitched.
    #[derive(Clone, Copy, Default)]
    pub(in crate::pool::split::arena) struct Growth {
        pub(in crate::pool::split::arena) total: u64,
        pub(in crate::pool::split::arena) stitch: u64,
        pub(in crate::pool::split::arena) map: u64,
        pub(in crate::pool::split::arena) sync: u64,
        pub(in crate::pool::split::arena) handles: u64,
    }

    static SEEN: Mutex<Vec<Growth>> = Mutex::new(Vec::new());

    /// Nanoseconds since `t`.
    pub(in crate::pool::split::arena) fn since(t: Instant) -> u64 {
        t.elapsed().as_nanos() as u64
    }

    fn pct(mut v: Vec<u64>, p: usize) -> f64 {
        if v.is_empty() {
            return 0.0;
        }
        v.sort_unstable();
        v[(v.len() - 1) * p / 100] as f64 / 1e3
    }

    pub(in crate::pool::split::arena) fn record(g: Growth) {
        let Ok(mut seen) = SEEN.lock() else { return };
        seen.push(g);
        if seen.len() % 50 != 0 {
            return;
        }
        let with: Vec<Growth> = seen.iter().copied().filter(|g| g.handles > 0).collect();
        let col = |f: fn(&Growth) -> u64, of: &[Growth]| of.iter().map(f).collect::<Vec<u64>>();
        let sum = |f: fn(&Growth) -> u64| seen.iter().map(f).sum::<u64>() as f64 / 1e6;
        eprintln!(
        "cudapool stitch-timing: {} growths, {} stitched ({} handles); growth with a stitch p50 {:.0} p99 {:.0} us, its stitch call p50 {:.0} p99 {:.0} us; growth without p50 {:.0} p99 {:.0} us; totals ms: growth {:.1} stitch {:.1} map {:.1} sync {:.1}",
        seen.len(),
        with.len(),
        with.iter().map(|g| g.handles).sum::<u64>(),
        pct(col(|g| g.total, &with), 50),
        pct(col(|g| g.total, &with), 99),
        pct(col(|g| g.stitch, &with), 50),
        pct(col(|g| g.stitch, &with), 99),
        pct(col(|g| g.total, &seen.iter().copied().filter(|g| g.handles == 0).collect::<Vec<_>>()), 50),
        pct(col(|g| g.total, &seen.iter().copied().filter(|g| g.handles == 0).collect::<Vec<_>>()), 99),
        sum(|g| g.total),
        sum(|g| g.stitch),
        sum(|g| g.map),
        sum(|g| g.sync),
    );
    }
}
