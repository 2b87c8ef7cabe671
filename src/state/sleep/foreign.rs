//! The program's own virtual memory asleep: what it made with `cuMemCreate` and mapped itself
//! (PyTorch's `expandable_segments:True`, JAX's allocator, a C++ program's own arena).
//!
//! A sleep copies every mapping of such a handle to the host, unmaps it and drops the driver's
//! references, so that the memory goes back. A wake makes the handle again with the program's
//! own properties, maps it where it was (same addresses, same offsets) with the access it had,
//! copies the bytes back and gives the driver as many references as the program held. The
//! program keeps its handle value: from then on the shim passes the driver's new value wherever
//! the program passes its own (`Counted::real`), and hands the program its own value back where
//! the driver answers with the new one (`cuMemRetainAllocationHandle`).
//!
//! What stays on the device: handles shared outside the process (exported, bound to a
//! multicast object, or handed out as a dma-buf: another process or device may hold them),
//! handles of another usage than plain memory (a sparse arrays' tile pool), handles with a
//! mapping the shim did not see or none at all (nothing to copy from), handles whose device
//! cannot read and write a mapping of them, and memory imported from another process (not the
//! program's to move). Every call on the program's virtual memory (map, unmap, release, access,
//! properties, export, retain) is work: a sleep waits for it and it wakes a sleeping process.

use super::copy::Way;
use super::{host_parts, Moved};
use crate::base::addr_hash::AddrMap as HashMap;
use crate::base::cu::*;
use crate::base::log::fmt_bytes;
use crate::base::sync::lock;
use crate::driver::{Inside, Own};
use crate::state::counted::{AsleepMap, Phys, ProgramAsleep, VmMap};
use crate::state::Shim;
use std::ffi::c_int;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// A handle of the program's that can sleep, as the tables hold it.
struct Plan {
    key: MemHandle,
    dev: CUdevice,
    size: u64,
    refs: u32,
    maps: Vec<(DevPtr, VmMap)>,
}

/// Whether the mappings cover every byte of a handle of `size` bytes: only then is what a sleep
/// copies (the mapped bytes) all of it. A byte the program wrote, unmapped and would map again
/// would otherwise come back zeroed, so a handle mapped in part stays awake.
fn covers(maps: &[(DevPtr, VmMap)], size: u64) -> bool {
    let mut spans: Vec<(u64, u64)> = maps
        .iter()
        .map(|(_, m)| (m.offset, m.offset.saturating_add(m.bytes)))
        .collect();
    spans.sort_unstable();
    let mut end = 0;
    for (start, stop) in spans {
        if start > end {
            return false;
        }
        end = end.max(stop);
    }
    end >= size
}

impl Shim {
    /// The program's handles on `device` (`-1`: every device) that can sleep (see the module's
    /// notes).
    fn foreign_plans(&self, device: CUdevice) -> Vec<Plan> {
        let handles = lock(&self.counted.handles);
        let mut by_handle: HashMap<MemHandle, Vec<(DevPtr, VmMap)>> = HashMap::default();
        for (&at, m) in lock(&self.counted.maps).iter() {
            by_handle.entry(m.handle).or_default().push((at, *m));
        }
        let mut out: Vec<Plan> = handles
            .iter()
            .filter(|(_, p)| (device < 0 || p.device == device) && p.asleep.is_none())
            .filter_map(|(&key, p)| {
                let prop = p.prop?;
                let maps = by_handle.remove(&key)?;
                let own = !p.shared && prop.usage() == 0;
                let whole = own && maps.len() == p.maps as usize && covers(&maps, p.size);
                whole.then_some(Plan {
                    key,
                    dev: p.device,
                    size: p.size,
                    refs: p.refs,
                    maps,
                })
            })
            .collect();
        out.sort_by_key(|p| (p.dev, p.maps[0].0));
        out
    }

    /// A context of `dev` to copy in: a pool's (guarded by its clock while `f` runs); else the
    /// calling thread's current context if it is of `dev` (a wake inside the program's own call:
    /// no driver call beyond two thread-local questions, which a capture allows); else the
    /// device's primary context if it is active. `None` when there is none. A context cannot end
    /// under `f`: its destroy, reset or last release is work, which waits for a sleep or wake
    /// under way (`Shim::context_ending`).
    fn in_device<T>(&self, dev: CUdevice, f: impl FnOnce(usize) -> T) -> Option<T> {
        for (ctx, cp) in self.contexts.on_device(dev) {
            if let Some(_alive) = cp.clock.enter() {
                return Some(self.in_context(ctx, || f(ctx)));
            }
        }
        let current = self.driver.current_context().ok().flatten();
        let ctx = match current {
            Some(c) if self.driver.current_device() == Ok(dev) => c as usize,
            _ => self.driver.active_primary_context(dev)? as usize,
        };
        Some(self.in_context(ctx, || f(ctx)))
    }

    /// Puts the program's own handles on `device` (`-1`: every device) to sleep. A handle that
    /// cannot (its mapping refused to go) stays awake, mapped as it was.
    pub(super) fn save_foreign(
        &self,
        own: Own<'_>,
        device: CUdevice,
        moved: &mut Moved,
        short: &mut bool,
    ) -> Result<(), String> {
        let plans = self.foreign_plans(device);
        let mut devices: Vec<CUdevice> = plans.iter().map(|p| p.dev).collect();
        devices.dedup();
        for dev in devices {
            let mine: Vec<&Plan> = plans.iter().filter(|p| p.dev == dev).collect();
            self.in_device(dev, |ctx| {
                self.save_foreign_on(own, ctx, dev, &mine, moved, short)
            })
            .unwrap_or(Ok(()))?;
        }
        Ok(())
    }

    fn save_foreign_on(
        &self,
        own: Own<'_>,
        ctx: usize,
        dev: CUdevice,
        plans: &[&Plan],
        moved: &mut Moved,
        short: &mut bool,
    ) -> Result<(), String> {
        let devices = self.driver.device_count().unwrap_or(1).max(1);
        // Who may touch each mapping; the device itself must read and write all of them.
        let mut going = Vec::new();
        for plan in plans {
            let access: Vec<Vec<(CUdevice, c_int)>> = (plan.maps.iter())
                .map(|&(at, _)| {
                    (0..devices)
                        .map(|d| (d, self.driver.vmm_access_of(d, at)))
                        .filter(|&(_, f)| f != 0)
                        .map(|(d, f)| (d, f as c_int))
                        .collect()
                })
                .collect();
            let rw = |a: &Vec<(CUdevice, c_int)>| {
                a.iter()
                    .any(|&(d, f)| d == dev && f as u64 == ACCESS_READ_WRITE)
            };
            if access.iter().all(rw) {
                going.push((plan, access));
            }
        }
        let total: u64 = going
            .iter()
            .flat_map(|(p, _)| &p.maps)
            .map(|(_, m)| m.bytes)
            .sum();
        super::host_room_for(total).inspect_err(|_| *short = true)?;
        let mut hosts = Vec::with_capacity(going.len());
        for (plan, _) in &going {
            let bytes = plan.maps.iter().map(|(_, m)| m.bytes).sum();
            hosts.push(self.sleep.host_copy(bytes).ok_or_else(|| {
                *short = true;
                format!(
                    "{} of host memory could not be had for the copy",
                    fmt_bytes(total)
                )
            })?);
        }
        let parts = host_parts(
            going
                .iter()
                .map(|(p, _)| p.maps.iter().map(|(at, m)| (*at, m.bytes)))
                .zip(&hosts),
        );
        // SAFETY: each host copy holds its handle's mappings' bytes one after the other, and
        // nothing else uses them meanwhile.
        unsafe { self.move_parts(ctx, &parts, Way::ToHost) }
            .map_err(|e| format!("copy to the host failed (error {e})"))?;
        for ((plan, access), host) in going.into_iter().zip(hosts) {
            let real = self.counted.real(plan.key);
            let mut unmapped = Vec::new();
            for &(at, m) in &plan.maps {
                match own.release().vmm_unmap_one(at, m.bytes) {
                    Ok(()) => unmapped.push((at, m)),
                    Err(_) => break,
                }
            }
            if unmapped.len() < plan.maps.len() {
                // Back as it was: the handle still holds the memory.
                for ((at, m), a) in unmapped.iter().zip(&access) {
                    let _ = self.driver.vmm_map_as(*at, m.bytes, m.offset, real, a);
                }
                continue;
            }
            for _ in 0..plan.refs {
                let _ = own.release().vmm_release(real);
            }
            let maps = (plan.maps.iter().zip(access))
                .map(|(&(at, m), access)| AsleepMap {
                    at,
                    bytes: m.bytes,
                    offset: m.offset,
                    access,
                })
                .collect();
            (self.counted).fell_asleep(plan.key, ProgramAsleep { maps, host });
            let budget = self.budget(dev);
            budget.uncharge(plan.size);
            budget.on_driver_free();
            moved.device_bytes += plan.size;
            moved.copied += plan.maps.iter().map(|(_, m)| m.bytes).sum::<u64>();
        }
        Ok(())
    }

    /// Makes every asleep handle of the program's again, device by device (all of a device's
    /// or none), waiting for room until `timeout` since `started`.
    pub(super) fn wake_foreign(
        &self,
        started: Instant,
        timeout: Option<Duration>,
        moved: &mut Moved,
    ) -> Result<(), CUresult> {
        loop {
            let first = lock(&self.counted.handles)
                .values()
                .find(|p| p.asleep.is_some())
                .map(|p| p.device);
            let Some(dev) = first else {
                return Ok(());
            };
            match self.wake_foreign_on(dev, moved)? {
                0 => self.sleep.waiting_for.store(0, Relaxed),
                need => self.wait_for_room(dev, need, started, timeout)?,
            }
        }
    }

    /// One try at waking the program's handles of `dev`: `Ok(0)` when they are awake, `Ok(n)`
    /// when `n` bytes found no room (nothing was kept of the try). Their records are held
    /// (the handles table's lock) from the first make to the last copy.
    fn wake_foreign_on(&self, dev: CUdevice, moved: &mut Moved) -> Result<u64, CUresult> {
        let mut handles = lock(&self.counted.handles);
        let mine: Vec<(MemHandle, &Phys, &ProgramAsleep)> = (handles.iter())
            .filter(|(_, p)| p.device == dev)
            .filter_map(|(&k, p)| Some((k, p, p.asleep.as_deref()?)))
            .collect();
        let need: u64 = mine.iter().map(|(_, p, _)| p.size).sum();
        let budget = self.budget(dev);
        let tried = self.in_device(dev, |ctx| {
            // Made and mapped so far: the driver's handles, in `mine`'s order.
            let mut made: Vec<MemHandle> = Vec::new();
            let mut result = Ok(());
            for &(_, p, a) in &mine {
                if !budget.try_charge(p.size) {
                    result = Err(CUDA_ERROR_OUT_OF_MEMORY);
                    break;
                }
                match self.make_again(p, a) {
                    Ok(h) => made.push(h),
                    Err(e) => {
                        budget.uncharge(p.size);
                        result = Err(e);
                        break;
                    }
                }
            }
            if result.is_ok() {
                let parts = host_parts(
                    (mine.iter())
                        .map(|(_, _, a)| (a.maps.iter().map(|m| (m.at, m.bytes)), &a.host)),
                );
                // SAFETY: each host copy holds its handle's mappings' bytes one after the other,
                // and stays in its record, whose table is held, until the copies are done.
                result = unsafe { self.move_parts(ctx, &parts, Way::ToDevice) };
            }
            if result.is_err() {
                let release = self.driver.release_inside(Inside::Wake);
                for (&(_, p, a), &h) in mine.iter().zip(&made) {
                    for m in &a.maps {
                        let _ = release.vmm_unmap_one(m.at, m.bytes);
                    }
                    let _ = release.vmm_release(h);
                    budget.uncharge(p.size);
                }
            }
            result.map(|()| made)
        });
        let keys: Vec<(MemHandle, u32, u64)> =
            mine.iter().map(|&(k, p, _)| (k, p.refs, p.size)).collect();
        let made = match tried {
            Some(Ok(made)) => made,
            // Out of memory: the contents stay on the host for the next try.
            Some(Err(CUDA_ERROR_OUT_OF_MEMORY)) => return Ok(need),
            Some(Err(e)) => return Err(e),
            // No context to copy in: the contents stay on the host for the next try.
            None => return Err(CUDA_ERROR_INVALID_CONTEXT),
        };
        for ((key, refs, size), real) in keys.into_iter().zip(made) {
            let Some(a) = self.counted.woke(&mut handles, key, real) else {
                continue;
            };
            // The driver holds as many references as the program did (one from the creation).
            match refs {
                0 => {
                    let _ = self.driver.release_inside(Inside::Wake).vmm_release(real);
                }
                n => {
                    for _ in 1..n {
                        let _ = self.driver.vmm_retain(a.maps[0].at);
                    }
                }
            }
            budget.on_driver_alloc();
            moved.device_bytes += size;
            moved.copied += a.maps.iter().map(|m| m.bytes).sum::<u64>();
            self.sleep.keep_spare(a.host);
        }
        Ok(0)
    }

    /// The handle `p` made again and mapped where it was (`a`), with its access; the driver's
    /// value. On an error nothing of it stays.
    fn make_again(&self, p: &Phys, a: &ProgramAsleep) -> Result<MemHandle, CUresult> {
        let prop = p.prop.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let h = self.driver.vmm_create_as(prop, p.size)?;
        for (i, m) in a.maps.iter().enumerate() {
            if let Err(e) = self
                .driver
                .vmm_map_as(m.at, m.bytes, m.offset, h, &m.access)
            {
                let release = self.driver.release_inside(Inside::Wake);
                for done in &a.maps[..i] {
                    let _ = release.vmm_unmap_one(done.at, done.bytes);
                }
                let _ = release.vmm_release(h);
                return Err(e);
            }
        }
        Ok(h)
    }
}
