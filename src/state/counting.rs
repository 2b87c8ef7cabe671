//! Pass-through accounting: what each counted allocation API charges against the limit and
//! when it stops (the tables are in `counted`; what each API costs is documented there).

use super::counted::{ArrayRec, DriverPool, Phys};
use super::{Live, Origin, Shim};
use crate::base::cu::*;
use crate::base::sync::lock;

impl Shim {
    /// A counted pass-through allocation. `charge` is what is known before the call; `alloc`
    /// returns the address and the real footprint; `release` undoes it if the footprint turns
    /// out not to fit.
    pub fn alloc_counted(
        &self,
        charge: u64,
        alloc: impl FnMut() -> Result<(DevPtr, u64), CUresult>,
        release: impl FnOnce(DevPtr),
    ) -> Result<DevPtr, CUresult> {
        let (ctx, dev) = self.current()?;
        let budget = self.budget(dev);
        let seen = budget.releases();
        if !budget.try_charge(charge) {
            let retry = |budget: &crate::limits::budget::DeviceBudget| budget.try_charge(charge);
            let reclaimed = self.reclaim_context(ctx, dev, u64::MAX) > 0 && retry(budget);
            // Or another thread gave memory back since we asked.
            let released = || self.released_since(dev, seen, charge);
            if !(reclaimed || released() || self.borrow(dev, charge) && retry(budget)) {
                return Err(self.failed(dev, charge, CUDA_ERROR_OUT_OF_MEMORY));
            }
            budget.on_reclaim_retry();
        }
        let (ptr, footprint) = match self.made_charged(dev, charge, alloc) {
            Ok(r) => r,
            Err(e) => return Err(self.failed(dev, charge, e)),
        };
        if footprint > charge && !budget.try_charge(footprint - charge) {
            release(ptr);
            budget.refund(charge);
            return Err(self.failed(dev, footprint, CUDA_ERROR_OUT_OF_MEMORY));
        }
        if footprint < charge {
            budget.refund(charge - footprint);
        }
        budget.on_driver_alloc();
        let (holder, _) = budget.on_alloc(footprint, false);
        self.live.insert(
            ptr,
            Live {
                ctx,
                device: dev,
                size: footprint,
                handed: footprint,
                origin: Origin::Counted,
                holder,
            },
        );
        self.observe(dev);
        Ok(ptr)
    }

    /// `make`, with `bytes` charged on `dev` for it. When the driver refuses it for lack of
    /// memory, the charge goes back and room made elsewhere is looked for (root's arbiter in an
    /// overcommitted job, a suspended job's memory coming back: `room_made_elsewhere`); if some
    /// came, `make` runs once more, charged again. An `Err`
    /// leaves nothing charged.
    fn made_charged<T>(
        &self,
        dev: CUdevice,
        bytes: u64,
        mut make: impl FnMut() -> Result<T, CUresult>,
    ) -> Result<T, CUresult> {
        let budget = self.budget(dev);
        match make() {
            Ok(r) => Ok(r),
            Err(CUDA_ERROR_OUT_OF_MEMORY) => {
                budget.refund(bytes);
                if !(self.room_made_elsewhere(dev, bytes) && budget.try_charge(bytes)) {
                    return Err(CUDA_ERROR_OUT_OF_MEMORY);
                }
                make().inspect_err(|_| budget.refund(bytes))
            }
            Err(e) => {
                budget.refund(bytes);
                Err(e)
            }
        }
    }

    /// Bytes of live allocations from the driver pool `pool`.
    pub fn live_bytes_of_driver_pool(&self, pool: usize) -> u64 {
        self.live.bytes_of_driver_pool(pool)
    }

    /// Charges `bytes` on `dev` for a pass-through allocation, giving back cached pool memory
    /// first if they do not fit; `Err` is the out-of-memory answer (logged and counted).
    pub(crate) fn charge_counted(&self, dev: CUdevice, bytes: u64) -> Result<(), CUresult> {
        let budget = self.budget(dev);
        let seen = budget.releases();
        if budget.try_charge(bytes) {
            return Ok(());
        }
        let reclaimed = self.reclaim_device(dev) > 0 && budget.try_charge(bytes);
        if reclaimed
            || self.released_since(dev, seen, bytes)
            || self.borrow(dev, bytes) && budget.try_charge(bytes)
        {
            budget.on_reclaim_retry();
            return Ok(());
        }
        Err(self.failed(dev, bytes, CUDA_ERROR_OUT_OF_MEMORY))
    }

    /// Charges `bytes` on `dev` if memory went back to the driver since the count `seen` (another
    /// thread's reclaim or free, between a failed charge and this one), trying again while it
    /// keeps coming back (bounded). Whether they are charged.
    fn released_since(&self, dev: CUdevice, mut seen: u64, bytes: u64) -> bool {
        let budget = self.budget(dev);
        for _ in 0..super::pooled::RELEASE_RETRIES {
            let now = budget.releases();
            if now == seen {
                return false;
            }
            seen = now;
            if budget.try_charge(bytes) {
                return true;
            }
        }
        false
    }

    /// The driver handed out `bytes` charged with [`charge_counted`](Self::charge_counted).
    fn counted_made(&self, dev: CUdevice, bytes: u64) {
        let budget = self.budget(dev);
        budget.on_driver_alloc();
        budget.on_alloc(bytes, false);
        self.observe(dev);
    }

    /// A counted object of `bytes` went back to the driver (or died with its context).
    fn counted_gone(&self, dev: CUdevice, bytes: u64) {
        let budget = self.budget(dev);
        budget.on_free(bytes, None);
        budget.uncharge(bytes);
        budget.on_driver_free();
        self.observe(dev);
    }

    // ---- driver pools -------------------------------------------------------------------

    /// `cuMemPoolCreate` succeeded: remember where the pool lives.
    pub fn driver_pool_created(&self, pool: usize, location_type: i32, location_id: i32) {
        let device = (location_type == CU_MEM_LOCATION_TYPE_DEVICE).then_some(location_id);
        lock(&self.counted.pools).insert(
            pool,
            DriverPool {
                device,
                charged: 0,
                destroyed: false,
            },
        );
    }

    /// A 64-bit attribute of a driver pool (`None` if the driver cannot say).
    fn pool_attribute(&self, pool: usize, attr: std::ffi::c_int) -> Option<u64> {
        self.driver.mem_pool_attribute(pool, attr)
    }

    /// Bytes the driver pool reserves now.
    fn pool_reserved(&self, pool: usize) -> Option<u64> {
        self.pool_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
    }

    /// Brings the charge of `pool` to what the driver says it reserves now.
    fn settle_pool(&self, pool: usize, rec: &mut DriverPool) {
        let (Some(dev), false) = (rec.device, rec.destroyed) else {
            return;
        };
        let Some(now) = self.pool_reserved(pool) else {
            return;
        };
        let budget = self.budget(dev);
        if now > rec.charged {
            budget.force_charge(now - rec.charged);
        } else {
            budget.uncharge(rec.charged - now);
        }
        rec.charged = now;
    }

    /// `cuMemAllocFromPoolAsync` of `size` bytes from `pool` in a context on `dev`: charges
    /// what the pool grows by. `alloc` calls the driver; `undo` frees its result and waits.
    pub fn alloc_from_driver_pool(
        &self,
        pool: usize,
        size: u64,
        ctx_dev: (usize, CUdevice),
        mut alloc: impl FnMut() -> Result<DevPtr, CUresult>,
        mut undo: impl FnMut(DevPtr),
    ) -> Result<DevPtr, CUresult> {
        self.alloc_from_driver_pool_once(pool, size, ctx_dev, &mut alloc, &mut undo, true)
    }

    /// [`alloc_from_driver_pool`](Self::alloc_from_driver_pool); with `ask`, a refusal by the
    /// driver asks root's arbiter for room (an overcommitted job) and, if it made some, tries
    /// once more.
    fn alloc_from_driver_pool_once(
        &self,
        pool: usize,
        size: u64,
        ctx_dev: (usize, CUdevice),
        alloc: &mut impl FnMut() -> Result<DevPtr, CUresult>,
        undo: &mut impl FnMut(DevPtr),
        ask: bool,
    ) -> Result<DevPtr, CUresult> {
        let key = pool;
        let mut pools = lock(&self.counted.pools);
        let rec = pools.entry(key).or_insert(DriverPool {
            device: Some(ctx_dev.1),
            charged: 0,
            destroyed: false,
        });
        let Some(dev) = rec.device else {
            drop(pools);
            return alloc(); // a host pool: not device memory
        };
        self.settle_pool(key, rec);
        let budget = self.budget(dev);
        // Charge ahead what the pool may have to grow by: the request less what the pool holds
        // idle, rounded to the 2 MiB the driver's pools grow in (the reading after the call
        // makes it exact).
        let idle = rec.charged.saturating_sub(
            self.pool_attribute(key, CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
                .unwrap_or(u64::MAX),
        );
        let ahead = if budget.hard_limit().is_none() {
            0
        } else {
            size.saturating_sub(idle).div_ceil(2 << 20) * (2 << 20)
        };
        let seen = budget.releases();
        if !budget.try_charge(ahead) {
            // Give back what the driver pool keeps idle, and cudapool's own cache (not during
            // a graph capture: the trim is cudapool's own call).
            if let Some(calls) = crate::base::flags::own_calls() {
                self.driver.own(&calls).mem_pool_trim_to(pool, 0);
            }
            self.settle_pool(key, rec);
            self.reclaim_device(dev);
            let charged = budget.try_charge(ahead)
                || self.released_since(dev, seen, ahead)
                || self.borrow(dev, ahead) && budget.try_charge(ahead);
            if !charged {
                drop(pools);
                return Err(self.failed(dev, size, CUDA_ERROR_OUT_OF_MEMORY));
            }
            budget.on_reclaim_retry();
        }
        let ptr = match alloc() {
            Ok(p) => p,
            Err(e) => {
                budget.refund(ahead);
                drop(pools);
                if e == CUDA_ERROR_OUT_OF_MEMORY && ask && self.room_made_elsewhere(dev, size) {
                    return self
                        .alloc_from_driver_pool_once(pool, size, ctx_dev, alloc, undo, false);
                }
                return Err(self.failed(dev, size, e));
            }
        };
        let now = self.pool_reserved(key).unwrap_or(rec.charged + ahead);
        let grown = now.saturating_sub(rec.charged);
        if grown > ahead && !budget.try_charge(grown - ahead) {
            // The pool grew past the limit: give it all back and say so.
            undo(ptr);
            if let Some(calls) = crate::base::flags::own_calls() {
                self.driver.own(&calls).mem_pool_trim_to(pool, 0);
            }
            budget.refund(ahead);
            self.settle_pool(key, rec);
            drop(pools);
            return Err(self.failed(dev, size, CUDA_ERROR_OUT_OF_MEMORY));
        }
        if grown < ahead {
            budget.refund(ahead - grown);
        }
        rec.charged = now.max(rec.charged);
        drop(pools);
        if grown > 0 {
            budget.on_driver_alloc();
        }
        let (holder, _) = budget.on_alloc(size, grown == 0);
        self.live.insert(
            ptr,
            Live {
                ctx: ctx_dev.0,
                device: dev,
                size,
                handed: size,
                origin: Origin::DriverPool(key),
                holder,
            },
        );
        self.observe(dev);
        Ok(ptr)
    }

    /// An allocation of `pool` of `size` bytes was freed (the live table already released it).
    pub fn driver_pool_freed(&self, pool: usize, size: u64) {
        let mut pools = lock(&self.counted.pools);
        let Some(rec) = pools.get_mut(&pool) else {
            return;
        };
        match (rec.device, rec.destroyed) {
            (Some(dev), true) => {
                let back = size.min(rec.charged);
                rec.charged -= back;
                self.budget(dev).uncharge(back);
                if rec.charged == 0 {
                    pools.remove(&pool);
                }
            }
            _ => self.settle_pool(pool, rec),
        }
    }

    /// `cuMemPoolTrimTo` succeeded: the pool may hold less now.
    pub fn driver_pool_trimmed(&self, pool: usize) {
        if let Some(rec) = lock(&self.counted.pools).get_mut(&pool) {
            self.settle_pool(pool, rec);
        }
    }

    /// `cuMemPoolDestroy` succeeded: its idle memory went back; `live_bytes` of it are still
    /// held by allocations the driver keeps until they are freed.
    pub fn driver_pool_destroyed(&self, pool: usize, live_bytes: u64) {
        let mut pools = lock(&self.counted.pools);
        let Some(mut rec) = pools.remove(&pool) else {
            return;
        };
        if let Some(dev) = rec.device {
            let keep = live_bytes.min(rec.charged);
            self.budget(dev).uncharge(rec.charged - keep);
            if keep > 0 {
                rec.charged = keep;
                rec.destroyed = true;
                pools.insert(pool, rec);
            }
        }
    }

    // ---- physical memory (cuMemCreate) --------------------------------------------------

    /// `cuMemCreate` of `size` bytes at a location, with the program's properties `prop`;
    /// `create` calls the driver. The handle value to give the program.
    pub fn mem_create(
        &self,
        size: u64,
        location: (i32, i32),
        prop: PropBytes,
        mut create: impl FnMut() -> Result<MemHandle, CUresult>,
    ) -> Result<MemHandle, CUresult> {
        if location.0 != CU_MEM_LOCATION_TYPE_DEVICE {
            // Host memory: not counted.
            return create().map(|r| self.counted.program_value(r));
        }
        let dev = location.1;
        self.charge_counted(dev, size)?;
        match self.made_charged(dev, size, create) {
            Ok(r) => {
                let h = self.counted.made(r, Phys::made(dev, size, prop));
                self.counted_made(dev, size);
                Ok(h)
            }
            Err(e) => Err(self.failed(dev, size, e)),
        }
    }

    /// The driver's handle behind the program's value `h` (they differ after a sleep).
    pub fn real_handle(&self, h: MemHandle) -> MemHandle {
        self.counted.real(h)
    }

    /// The program's value for a handle `r` the driver just handed out (see
    /// [`Counted::program_value`](super::counted::Counted::program_value)).
    pub fn program_handle(&self, r: MemHandle) -> MemHandle {
        self.counted.program_value(r)
    }

    /// Whether any handle value the program holds differs from the driver's.
    pub fn handles_remapped(&self) -> bool {
        self.counted.remapped()
    }

    /// The program's handle `h` is shared outside the process: it never sleeps.
    pub fn mem_shared(&self, h: MemHandle) {
        self.counted.shared(h);
    }

    /// The program's memory mapped in `[at, at + bytes)` is shared outside the process.
    pub fn range_shared(&self, at: DevPtr, bytes: u64) {
        self.counted.range_shared(at, bytes);
    }

    /// `cuMemRelease(h)` succeeded.
    pub fn mem_released(&self, h: MemHandle) {
        if let Some((dev, size)) = self.counted.released(h) {
            self.counted_gone(dev, size);
        }
    }

    /// `cuMemRetainAllocationHandle` handed out `h` again.
    pub fn mem_retained(&self, h: MemHandle) {
        self.counted.retained(h);
    }

    /// `cuMemMap(va, size, offset, h)` succeeded (`h`: the program's value).
    pub fn mem_mapped(&self, va: DevPtr, size: u64, offset: u64, h: MemHandle) {
        self.counted.mapped(va, size, offset, h);
    }

    /// `cuMemUnmap(va, size)` succeeded: every mapping that starts in the range is gone.
    pub fn mem_unmapped(&self, va: DevPtr, size: u64) {
        for (dev, size) in self.counted.unmapped(va, size) {
            self.counted_gone(dev, size);
        }
    }

    // ---- arrays -------------------------------------------------------------------------

    /// What an array (or, with `levels`, a mipmapped array) of `desc` occupies on `dev`: asked
    /// of the driver through a twin created without memory, else estimated from the texels.
    fn array_footprint(&self, desc: &Array3DDesc, levels: Option<u32>, dev: CUdevice) -> u64 {
        let mut twin = *desc;
        twin.flags |= CUDA_ARRAY3D_DEFERRED_MAPPING;
        if let Some(bytes) = self.driver.array_requirements(&twin, levels, dev) {
            return bytes;
        }
        // Every mip level, each half the last in every dimension.
        (0..levels.unwrap_or(1).clamp(1, 32))
            .map(|l| {
                let mut lv = *desc;
                lv.width = (desc.width >> l).max(1);
                lv.height = if desc.height == 0 {
                    0
                } else {
                    (desc.height >> l).max(1)
                };
                lv.depth = if desc.depth == 0 {
                    0
                } else {
                    (desc.depth >> l).max(1)
                };
                lv.texel_bytes()
            })
            .fold(0u64, u64::saturating_add)
    }

    /// Creates an array (or, with `levels`, a mipmapped array) of `desc` through `create`,
    /// charged at its footprint. Sparse and deferred-mapping arrays hold no memory of their
    /// own (what backs them comes from `cuMemCreate`) and are passed through.
    pub fn array_create(
        &self,
        desc: &Array3DDesc,
        levels: Option<u32>,
        mut create: impl FnMut() -> Result<Opaque, CUresult>,
    ) -> Result<Opaque, CUresult> {
        const SPARSE: u32 = 0x40;
        if desc.flags & (SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING) != 0 {
            return create();
        }
        let ctx = self
            .driver
            .current_context()?
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)? as usize;
        let dev = self.driver.current_device()?;
        let size = self.array_footprint(desc, levels, dev);
        self.charge_counted(dev, size)?;
        match self.made_charged(dev, size, create) {
            Ok(h) => {
                lock(&self.counted.arrays).insert(
                    h as usize,
                    ArrayRec {
                        ctx,
                        device: dev,
                        size,
                    },
                );
                self.counted_made(dev, size);
                Ok(h)
            }
            Err(e) => Err(self.failed(dev, size, e)),
        }
    }

    /// `cuArrayDestroy` / `cuMipmappedArrayDestroy` of `h` succeeded.
    pub fn array_destroyed(&self, h: usize) {
        let rec = lock(&self.counted.arrays).remove(&h);
        if let Some(a) = rec {
            self.counted_gone(a.device, a.size);
        }
    }

    /// The context `ctx` died: its arrays went with it.
    pub(crate) fn counted_context_gone(&self, ctx: usize) {
        self.graphs_context_gone();
        let gone: Vec<ArrayRec> = {
            let mut arrays = lock(&self.counted.arrays);
            let keys: Vec<usize> = arrays
                .iter()
                .filter(|(_, a)| a.ctx == ctx)
                .map(|(&k, _)| k)
                .collect();
            keys.into_iter().filter_map(|k| arrays.remove(&k)).collect()
        };
        for a in gone {
            self.counted_gone(a.device, a.size);
        }
    }
}
