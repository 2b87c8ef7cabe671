//! What a pool is and what it works with: the [`Upstream`] it gets segments from, the [`Pool`]
//! trait every kind implements, and the views a snapshot shows. No behaviour here.

use super::handed::{Grant, Held};
use crate::base::config::{CacheIdle, PoolKind};
use crate::base::cu::{CUresult, DevPtr};
use crate::base::host_copy::HostCopy;
use crate::base::limit::Limit;

/// Where a pool gets device memory.
pub trait Upstream {
    /// A new segment of exactly `bytes`, or the error to give the program
    /// (`CUDA_ERROR_OUT_OF_MEMORY` when the limit or the device is full).
    fn alloc(&self, bytes: u64) -> Result<DevPtr, CUresult>;
    /// Gives back a segment obtained from [`alloc`](Self::alloc) with the same `bytes`; each
    /// once. A release of the pool's own: it may be refused (during a graph capture), and the
    /// pool then keeps the segment.
    fn free(&self, ptr: DevPtr, bytes: u64) -> Result<(), CUresult>;
    /// Gives back a segment the program itself freed (the `none` pool, where the program's
    /// free is the driver's to judge, during a capture too).
    fn free_for_program(&self, ptr: DevPtr, bytes: u64) -> Result<(), CUresult> {
        self.free(ptr, bytes)
    }
    /// How much more [`alloc`](Self::alloc) could grant before the limit refuses (a hint: the
    /// device itself may have less).
    fn headroom(&self) -> u64 {
        u64::MAX
    }
    /// The hard limit that [`alloc`](Self::alloc) enforces.
    fn limit(&self) -> Limit {
        Limit::NONE
    }
    /// Whether the memory held is above the soft limit: freed blocks should go back now.
    fn over_soft_limit(&self) -> bool {
        false
    }
    /// How long freed memory may stay cached while nothing takes it again
    /// (`CUDAPOOL_CACHE_IDLE`; see [`super::reuse::Demand`]). Never given back by itself unless
    /// the upstream says so.
    fn cache_idle(&self) -> CacheIdle {
        CacheIdle::Never
    }

    /// The virtual memory this upstream offers, if any: then a pool may grow a range in place
    /// (expandable segments).
    fn virtual_memory(&self) -> Option<&dyn VirtualMemory> {
        None
    }
    /// Waits for all device work of the pool's context; `false` when it cannot.
    fn synchronize(&self) -> bool {
        false
    }
}

/// An upstream's virtual memory (CUDA's `cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`):
/// address ranges reserved with nothing behind them, and physical allocations (*handles*)
/// mapped into them and out again. What `split`'s expandable arena grows and shrinks by.
pub trait VirtualMemory {
    /// What it offers now (`None`: the device has no virtual memory, and large requests get
    /// classic segments).
    fn vmm(&self) -> Option<Vmm>;
    /// Reserves `bytes` (a multiple of `chunk`, the [`Vmm::chunk`] it offered) of address
    /// space aligned to `chunk`, no memory behind it.
    fn reserve(&self, bytes: u64, chunk: u64) -> Result<DevPtr, CUresult>;
    /// Gives back a range from [`reserve`](Self::reserve), nothing mapped in it.
    fn unreserve(&self, at: DevPtr, bytes: u64);
    /// Puts memory behind `[at, at + bytes)` (aligned to [`Vmm::chunk`], inside a reserved
    /// range, not mapped), one physical allocation (*handle*) per `handle` bytes (a multiple
    /// of [`Vmm::chunk`] dividing `bytes`), charged like [`Upstream::alloc`]:
    /// `CUDA_ERROR_OUT_OF_MEMORY` when the limit or the device is full. All or nothing.
    fn map(&self, at: DevPtr, bytes: u64, handle: u64) -> Result<(), CUresult>;
    /// Takes the memory from behind `[at, at + bytes)` (mapped in handles of `handle` bytes)
    /// and gives it back. Unlike [`Upstream::free`] this does not wait for the device: the
    /// caller makes sure no device work still uses the range.
    fn unmap(&self, at: DevPtr, bytes: u64, handle: u64) -> Result<(), CUresult>;
    /// Maps each handle of `handles` (its start and bytes: one handle mapped there) a second
    /// time, one after the other from `to` (aligned, reserved, not mapped), charging nothing:
    /// the same memory now has two addresses. The caller uses it at one only, and unmaps the
    /// other with [`unmap_alias`] (while a mapping of it is left, the memory stays). The access
    /// is set once for the whole run (on a GPU that call is most of a stitch's cost). Returns
    /// how many were stitched, a prefix of `handles` (a refusal stops there); an error when
    /// none was. `CUDA_ERROR_NOT_SUPPORTED`: memory is not stitched here (no virtual memory, or
    /// a tool that must see each allocation apart is attached).
    ///
    /// [`unmap_alias`]: Self::unmap_alias
    fn stitch(&self, handles: &[(DevPtr, u64)], to: DevPtr) -> Result<usize, CUresult>;
    /// Unmaps the one handle mapped at `[at, at + bytes)` whose memory [`stitch`](Self::stitch)
    /// mapped elsewhere too, charging nothing back (the other mapping keeps the memory).
    /// Like [`unmap`](Self::unmap), it does not wait for the device.
    fn unmap_alias(&self, at: DevPtr, bytes: u64) -> Result<(), CUresult>;
}

/// What [`VirtualMemory::vmm`] offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vmm {
    /// Memory is mapped and unmapped in multiples of this, at multiples of it (the smallest
    /// handle).
    pub chunk: u64,
    /// How much address space to reserve for one range (the device's memory, rounded up).
    pub span: u64,
}

/// The stream a stream-ordered call (`cuMemAllocAsync`, `cuMemFreeAsync`) names, as the pool
/// sees it: an opaque key, distinct per stream (and per thread for per-thread default streams).
pub type StreamKey = u64;

/// What a context's end leaves to give back: its memory goes with it, except memory mapped
/// into address space the pool reserved (the virtual memory API's objects are the process's).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Forgotten {
    /// Segments and bytes the pool held (they count no more).
    pub segments: u64,
    pub bytes: u64,
    /// An arena's reserved range and mapped memory.
    pub arena: Option<ArenaLeft>,
}

/// An arena as a context's end leaves it: its reserved range (start, bytes) and each mapping
/// in it (start, bytes: one handle each, stitched memory's second mappings included).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArenaLeft {
    pub range: (DevPtr, u64),
    pub mapped: Vec<(DevPtr, u64)>,
}

/// Physical memory a sleep moves (see [`Pool::sleep`]): one handle mapped at `at` for
/// `bytes`, and the parts of it that blocks not free in the pool lie on (what must be kept),
/// by address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapped {
    pub at: DevPtr,
    pub bytes: u64,
    pub live: Vec<(DevPtr, u64)>,
}

/// What a sleep does with the pool's mapped memory (see [`Pool::sleep`]).
pub type Save<'a> = dyn FnMut(&[Mapped], &mut Vec<(DevPtr, Asleep)>) -> Result<(), String> + 'a;
/// What a wake does with the pool's asleep handles (see [`Pool::wake`]).
pub type Restore<'a> = dyn FnMut(&[(DevPtr, u64, &Asleep)]) -> Result<(), CUresult> + 'a;

/// One handle asleep (see [`Pool::sleep`]): its memory given back to the driver, and the
/// parts of it blocks not free lay on (address, bytes, in address order) kept in `host`, one
/// after the other. The pool holds it in the handle's record until a wake maps the handle
/// again or a release drops it (the memory went back at the sleep, so nothing is unmapped).
pub struct Asleep {
    pub live: Vec<(DevPtr, u64)>,
    pub host: HostCopy,
}

impl Asleep {
    /// Bytes kept on the host.
    pub fn kept(&self) -> u64 {
        self.live.iter().map(|&(_, n)| n).sum()
    }
}

/// What a pool's sleep and wake read and write of its core's memory (split's arena holds
/// each handle's state: mapped, shadowed or asleep).
pub trait Sleeping {
    /// Every handle mapped (not asleep) with the parts of it blocks not free lie on, by address;
    /// `None` while memory is mapped twice (a shadow whose unmap failed), which a sleep cannot
    /// give back.
    fn awake_memory(&self) -> Option<Vec<Mapped>>;
    /// The handle at `at`, mapped, was unmapped by a sleep that kept `asleep`.
    fn fell_asleep(&mut self, at: DevPtr, asleep: Asleep);
    /// Every handle asleep: (start, bytes, what is kept), by address.
    fn asleep(&self) -> Vec<(DevPtr, u64, &Asleep)>;
    /// Every handle asleep was mapped again and filled: each is mapped now; their records
    /// (bytes, what was kept).
    fn woke(&mut self) -> Vec<(u64, Asleep)>;
    /// Bytes of the handles asleep.
    fn asleep_bytes(&self) -> u64;
}

/// One block as a snapshot shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockView {
    pub ptr: DevPtr,
    pub size: u64,
    pub state: BlockState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// Held by the program.
    InUse,
    /// Freed, waiting until no earlier device work can touch it (or in a thread's magazine).
    Pending,
    /// Cached, ready for reuse.
    Free,
}

impl BlockState {
    pub fn name(self) -> &'static str {
        match self {
            BlockState::InUse => "in_use",
            BlockState::Pending => "pending",
            BlockState::Free => "free",
        }
    }
}

/// Where a block lies: what address queries about a pointer inside it answer (the block is the
/// program's allocation; the segment is the driver's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSpan {
    pub ptr: DevPtr,
    pub size: u64,
    /// The segment that holds it (equal to `ptr` when the block starts its segment).
    pub segment: DevPtr,
    /// The segment is an expandable one: mapped memory, which has no legacy IPC handle.
    pub expandable: bool,
}

/// One segment (driver allocation) and the blocks that tile it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentView {
    pub ptr: DevPtr,
    pub size: u64,
    pub blocks: Vec<BlockView>,
    /// Mapped memory of an expandable segment (a run of it: the range's unmapped parts are
    /// not shown).
    pub expandable: bool,
}

/// A pool kind. Callers guarantee what the pool cannot check cheaply: `free` is called once per
/// block returned by `alloc`, with the [`Held`] its grant and request make (the shim's live
/// table makes sure).
pub trait Pool: Send + Sync {
    fn kind(&self) -> PoolKind;
    /// A block of at least `size` (> 0) bytes.
    fn alloc(&self, size: u64, up: &dyn Upstream) -> Result<Grant, CUresult>;
    /// The program is done with a block. On `Err` the block is still the program's.
    fn free(&self, block: Held, up: &dyn Upstream) -> Result<(), CUresult>;
    /// A stream-ordered allocation on stream `on`: besides what [`alloc`](Self::alloc) may
    /// hand out, it may take a block freed in order on `on` before that free's fence is done
    /// (work on `on` after the allocation runs after the free), from inside the core.
    fn alloc_on(&self, size: u64, on: StreamKey, up: &dyn Upstream) -> Result<Grant, CUresult> {
        let _ = on;
        self.alloc(size, up)
    }
    /// A stream-ordered free on stream `on`: the block may be reused at once by allocations
    /// ordered on `on`, and by anything else after a fence (as for [`free`](Self::free)).
    fn free_on(&self, block: Held, on: StreamKey, up: &dyn Upstream) -> Result<(), CUresult> {
        let _ = on;
        self.free(block, up)
    }
    /// The last try before out of memory: gives every free segment that is ready now back to
    /// the upstream and allocates, under one hold of the pool, so that no other thread of this
    /// pool takes the room in between (with eight threads freeing sizes that never come again,
    /// the room a reclaim made was gone before the retry otherwise). `on` as for
    /// [`alloc_on`](Self::alloc_on).
    fn alloc_released(
        &self,
        size: u64,
        on: Option<StreamKey>,
        up: &dyn Upstream,
    ) -> Result<Grant, CUresult> {
        match on {
            Some(s) => self.alloc_on(size, s, up),
            None => self.alloc(size, up),
        }
    }
    /// Waits for every pending free, then gives free segments back to the upstream until at
    /// least `need` bytes went back (`u64::MAX`: all of them); returns the bytes released.
    fn trim(&self, up: &dyn Upstream, need: u64) -> u64;
    /// Gives every cached segment back to the upstream; returns the bytes released.
    fn reclaim(&self, up: &dyn Upstream) -> u64 {
        self.trim(up, u64::MAX)
    }
    /// Gives back free segments that are ready now (no waiting for a fence, nor for the
    /// device) until at least `need` bytes went back; returns the bytes released. For lending
    /// idle cache to another process of a group.
    fn release_ready(&self, up: &dyn Upstream, need: u64) -> u64 {
        let _ = (up, need);
        0
    }
    /// Bytes held for reuse.
    fn cached_bytes(&self) -> u64;
    /// Every segment the pool holds and its blocks, by address (`none` holds no list: its
    /// blocks are the shim's live allocations).
    fn segments(&self) -> Vec<SegmentView>;
    /// Whether `ptr` lies inside memory this pool holds from the upstream (in use or cached).
    /// Such a pointer must never reach the driver's free.
    fn owns(&self, ptr: DevPtr) -> bool;
    /// The block holding `ptr` that is not free in the cache (handed out, or freed and still
    /// in a thread's magazine or waiting for its fence), if this pool holds one there. The
    /// live table says which of these the program holds.
    fn block_of(&self, ptr: DevPtr) -> Option<BlockSpan> {
        let _ = ptr;
        None
    }
    /// The calling thread's own cache in this pool (see [`ThreadCache`](super::ThreadCache)),
    /// made on first use; `None` for a pool without one, or while the thread is torn down.
    fn thread_cache(&self) -> Option<super::ThreadCache> {
        None
    }
    /// The freed blocks waiting for a fence (their reuse by anyone held back until it is done),
    /// by address: what a history's `free_completed` waits for.
    fn fenced(&self) -> Vec<DevPtr> {
        Vec::new()
    }
    /// The handles (physical allocations: start, bytes) whose memory lies under the held block
    /// at `ptr` of an expandable segment, in address order: what an export of it shares
    /// (`state::ipc_mapped`). Empty for a block of a classic segment.
    fn handles_under(&self, ptr: DevPtr) -> Vec<(DevPtr, u64)> {
        let _ = ptr;
        Vec::new()
    }
    /// Large requests get classic segments from now on (see [`super::core::Core::stop_expanding`]).
    fn stop_expanding(&self) {}
    /// Puts the pool's memory to sleep: gives every free segment back (the caller made sure no
    /// device work is in flight), then, under one hold of the pool, hands `save` every mapping
    /// of physical memory that is mapped and can be unmapped and mapped again at its own
    /// address (the arena's handles not asleep), in address order. `save` keeps what it must
    /// and unmaps them, pushing each handle it unmapped with what it kept, or fails; what it
    /// pushed is asleep either way (its record holds it). Classic segments (whole driver
    /// allocations) stay: their address cannot be had again. `Err`: why this pool cannot
    /// sleep, or `save`'s error.
    fn sleep(&self, up: &dyn Upstream, save: &mut Save<'_>) -> Result<(), String> {
        let _ = (up, save);
        Ok(())
    }
    /// Wakes the pool's asleep handles, all or none, under one hold of the pool: `restore`
    /// gets each (start, bytes, what is kept), maps and fills them, or fails having unmapped
    /// what it mapped (they stay asleep). `Ok`: the records of what woke (bytes, what was kept).
    fn wake(&self, restore: &mut Restore<'_>) -> Result<Vec<(u64, Asleep)>, CUresult> {
        let _ = restore;
        Ok(Vec::new())
    }
    /// Bytes of the pool's handles asleep.
    fn asleep_bytes(&self) -> u64 {
        0
    }
    /// The context died, and its memory with it: forget every segment without calling the
    /// upstream. Says what was held, and what the context's end does not take with it.
    fn forget_all(&self) -> Forgotten;
    /// Every invariant written on the pool and its core, verified from scratch, or the first
    /// one broken (see [`super::core::Core::check`]).
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}
