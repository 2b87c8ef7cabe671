//! What a pool hands out and takes back, as plain figures: a core's block ([`Taken`]), the
//! pool's grant ([`Grant`]) and the block as the program gives it back ([`Held`]). Below every
//! other file of the pool: the trait, the cores and the threads' magazines all speak of them.

use crate::base::cu::DevPtr;

/// A block a core hands out: its address and its size (at least the request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Taken {
    pub ptr: DevPtr,
    pub size: u64,
}

/// What [`Pool::alloc`](super::Pool::alloc) hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    pub ptr: DevPtr,
    /// The block's size: at least the request (its rounding, and a free block's rest too
    /// small to split off).
    pub size: u64,
    /// Served from cached memory, without asking the upstream.
    pub from_cache: bool,
}

impl Grant {
    /// The block as the program gives it back, having asked for `asked` bytes.
    pub fn held(self, asked: u64) -> Held {
        Held {
            ptr: self.ptr,
            asked,
            size: self.size,
        }
    }
}

/// A block the program holds, as it gives it back: where it is, what the program asked for,
/// and what it was handed ([`Grant::size`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    pub ptr: DevPtr,
    pub asked: u64,
    pub size: u64,
}
