//! A hard limit on bytes, or none: the one spelling of "no limit" (it was `0` in some places,
//! `u64::MAX` in others). Kept raw as `0` for none where it is stored or shown (the budget's
//! atomics, a group's ledger, the C API, the metrics), as the contract spells it.

/// A hard limit on bytes; [`Limit::NONE`] lets anything through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limit(u64);

impl Limit {
    pub const NONE: Limit = Limit(0);

    /// From its stored form, where 0 means none.
    pub const fn from_raw(raw: u64) -> Limit {
        Limit(raw)
    }

    /// Its stored form: the bytes, 0 for none.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// The bytes, if there is a limit.
    pub fn bytes(self) -> Option<u64> {
        (self.0 != 0).then_some(self.0)
    }

    pub fn is_none(self) -> bool {
        self.0 == 0
    }

    /// Whether a total of `bytes` stays within it.
    pub fn admits(self, bytes: u64) -> bool {
        self.0 == 0 || bytes <= self.0
    }

    /// The room above `used` (`u64::MAX` without a limit).
    pub fn room(self, used: u64) -> u64 {
        match self.0 {
            0 => u64::MAX,
            l => l.saturating_sub(used),
        }
    }

    /// The tighter of the two.
    pub fn min(self, other: Limit) -> Limit {
        match (self.bytes(), other.bytes()) {
            (Some(a), Some(b)) => Limit(a.min(b)),
            (Some(_), None) => self,
            _ => other,
        }
    }

    /// The bytes as a cap on a figure (`u64::MAX` without a limit).
    pub fn cap(self) -> u64 {
        self.bytes().unwrap_or(u64::MAX)
    }
}

/// As a reader sees it: "none", or the bytes in binary units.
impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.bytes() {
            None => f.write_str("none"),
            Some(b) => f.write_str(&crate::base::log::fmt_bytes(b)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Limit;

    #[test]
    fn none_admits_everything_and_the_tighter_wins() {
        assert!(Limit::NONE.admits(u64::MAX) && Limit::NONE.is_none());
        assert_eq!(Limit::NONE.room(5), u64::MAX);
        let l = Limit::from_raw(100);
        assert!(l.admits(100) && !l.admits(101));
        assert_eq!((l.room(30), l.room(130), l.cap()), (70, 0, 100));
        assert_eq!(l.min(Limit::NONE), l);
        assert_eq!(Limit::NONE.min(l), l);
        assert_eq!(l.min(Limit::from_raw(50)).bytes(), Some(50));
        assert_eq!(Limit::NONE.cap(), u64::MAX);
        assert_eq!(
            (Limit::NONE.to_string(), l.to_string()),
            ("none".into(), "100 B".into())
        );
    }
}
