//! What the pool is made of: its kind (`CUDAPOOL_POOL`), when it reuses (`CUDAPOOL_REUSE`),
//! how it takes memory for large requests (`CUDAPOOL_SEGMENTS`) and when its arena stitches
//! (`CUDAPOOL_STITCH`).

/// Which pool serves `cuMemAlloc`/`cuMemFree` (`CUDAPOOL_POOL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    Split,
    Binned,
    Simple,
    None,
}

impl PoolKind {
    pub const ACCEPTED: &'static str = "split, binned, simple or none";

    pub fn parse(s: &str) -> Option<PoolKind> {
        match s.trim().to_ascii_lowercase().as_str() {
            "split" => Some(PoolKind::Split),
            "binned" => Some(PoolKind::Binned),
            "simple" => Some(PoolKind::Simple),
            "none" => Some(PoolKind::None),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PoolKind::Split => "split",
            PoolKind::Binned => "binned",
            PoolKind::Simple => "simple",
            PoolKind::None => "none",
        }
    }
}

/// `CUDAPOOL_REUSE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reuse {
    Auto,
    Immediate,
}

/// `CUDAPOOL_SEGMENTS`: how `split` takes memory for large requests. Expandable is the
/// default: the least memory on every job measured (docs/benchmarks.md#whole-jobs), and its
/// blocks cross processes through legacy IPC like classic ones (`state::ipc_mapped`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Segments {
    /// Whole driver allocations (`cuMemAlloc`).
    Classic,
    /// One reserved address range per context that grows and shrinks by mapping chunks.
    Expandable,
}

/// `CUDAPOOL_STITCH`: when an expandable arena maps the memory of its free blocks again
/// (stitches) instead of taking more. Near a limit is the default: stitching at every growth
/// holds the least memory but costs time on jobs whose steps reshuffle memory
/// (docs/benchmarks.md, "Stitching at every growth").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Stitch {
    /// Only when a growth would leave less than an eighth of the limit.
    #[default]
    NearLimit,
    /// At every growth, limit or not (handles then at most 1/16 of the request that grows).
    Always,
}

impl Stitch {
    pub const ACCEPTED: &'static str = "near-limit or always";

    pub fn parse(v: &str) -> Option<Self> {
        match v.trim().to_ascii_lowercase().replace('_', "-").as_str() {
            "near-limit" => Some(Stitch::NearLimit),
            "always" => Some(Stitch::Always),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Stitch::NearLimit => "near-limit",
            Stitch::Always => "always",
        }
    }
}
