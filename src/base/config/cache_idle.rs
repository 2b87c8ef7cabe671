//! `CUDAPOOL_CACHE_IDLE`: how long freed memory stays cached while nothing takes it again.

use super::parse_duration;

/// `CUDAPOOL_CACHE_IDLE`: how long freed memory stays in cudapool's cache while nothing takes
/// it again (docs/design.md, Giving back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheIdle {
    /// Kept until pressure (a reclaim, the limit, a group member's request).
    Never,
    /// Given back after this long unused; `Duration::ZERO`: at once, nothing is cached.
    After(std::time::Duration),
}

impl CacheIdle {
    /// The default, chosen by measurement (README, Giving back): long enough that a training
    /// step's memory is reused from the cache (steps of up to about a second), short enough
    /// that an idle process holds almost nothing beyond its live blocks within three seconds.
    pub const DEFAULT: CacheIdle = CacheIdle::After(std::time::Duration::from_secs(2));
    pub const ACCEPTED: &'static str =
        "a duration (500ms, 2s, 5m, 1h, or plain seconds), 0 (freed memory goes back at once) or never";

    /// Whether nothing is cached at all (`0`).
    pub fn at_once(self) -> bool {
        self == CacheIdle::After(std::time::Duration::ZERO)
    }

    /// The window after which unused cached memory goes back, if it ever does (not `0`).
    pub fn window(self) -> Option<std::time::Duration> {
        match self {
            CacheIdle::After(d) if !d.is_zero() => Some(d),
            _ => None,
        }
    }

    pub fn parse(s: &str) -> Result<CacheIdle, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "never" => Ok(CacheIdle::Never),
            other => parse_duration(other).map(CacheIdle::After),
        }
    }
}
