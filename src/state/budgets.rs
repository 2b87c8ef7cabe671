//! The per-device budgets of the process: each device's limits (resolved from the
//! configuration on first use) and counters, and its share of the group's budget when the
//! process is in a group (the GPU found in the ledger by its UUID).

use crate::base::config::Config;
use crate::base::config::LogLevel::{Error, Info, Warn};
use crate::base::cu::CUdevice;
use crate::base::log::fmt_bytes;
use crate::driver::Driver;
use crate::limits::budget::{DeviceBudget, Shared as _};
use crate::limits::group::{Group, GroupDevice};
use crate::log_at;
use std::sync::{Arc, OnceLock};

/// Device ordinals beyond this share one unlimited budget (and a warning says so).
pub const MAX_DEVICES: usize = 64;

/// Invariants: `slots[d]` is set from the first time device `d` is touched (an allocation, a
/// query, the C API), with the limits the configuration gives it then.
/// `uuids[d]` is device `d`'s UUID once asked (`None`: the driver could not say). In a group,
/// `shares[d]` is set with `slots[d]`: the group's GPU its budget draws on.
pub struct Budgets {
    slots: [OnceLock<DeviceBudget>; MAX_DEVICES],
    overflow: DeviceBudget,
    uuids: [OnceLock<Option<[u8; 16]>>; MAX_DEVICES],
    group: Option<Arc<Group>>,
    shares: [OnceLock<GroupDevice>; MAX_DEVICES],
    /// The per-device limits' ordinals were checked against the devices seen.
    ordinals_checked: std::sync::Once,
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets::new(None)
    }
}

impl Budgets {
    /// The budgets of a process in `group` (or none).
    pub fn new(group: Option<Arc<Group>>) -> Budgets {
        Budgets {
            slots: std::array::from_fn(|_| OnceLock::new()),
            overflow: DeviceBudget::new(0, 0),
            uuids: std::array::from_fn(|_| OnceLock::new()),
            group,
            shares: std::array::from_fn(|_| OnceLock::new()),
            ordinals_checked: std::sync::Once::new(),
        }
    }

    /// The group's GPU device `dev`'s budget draws on, if the process is in a group.
    pub fn share(&self, dev: CUdevice) -> Option<&GroupDevice> {
        self.shares.get(usize::try_from(dev).ok()?)?.get()
    }

    /// The budget of `dev`, with its limits resolved on first use (a percentage asks the
    /// driver for the device's total memory).
    #[inline]
    pub fn get(&self, dev: CUdevice, driver: &Driver, config: &Config) -> &DeviceBudget {
        // Every call after the device's first: one bounds check and one load.
        match usize::try_from(dev)
            .ok()
            .and_then(|d| self.slots.get(d)?.get())
        {
            Some(b) => b,
            None => self.first_use(dev, driver, config),
        }
    }

    /// Says once, at the first device's first use, which per-device limits name a device this
    /// process does not see (a typo or a `CUDA_VISIBLE_DEVICES` that hides it): they apply to
    /// nothing.
    fn check_ordinals(&self, driver: &Driver, config: &Config) {
        self.ordinals_checked.call_once(|| {
            let Some(n) = driver.device_count() else { return };
            // Started by `cudapool run`: its --limit and --pool set these variables.
            let limit = if std::env::var_os("CUDAPOOL_RUN_PID").is_some() {
                "--limit (CUDAPOOL_MEMORY_LIMIT)"
            } else {
                "CUDAPOOL_MEMORY_LIMIT"
            };
            for (var, limits) in [
                (limit, &config.memory_limit),
                ("CUDAPOOL_SOFT_LIMIT", &config.soft_limit),
                ("CUDAPOOL_GROUP_LIMIT", &config.group_limit),
            ] {
                for (ord, _) in &limits.per_device {
                    if i64::from(*ord) >= i64::from(n) {
                        log_at!(
                            Warn,
                            "{var} names device {ord}, but this process sees {n} device{}: that entry applies to nothing",
                            if n == 1 { "" } else { "s" }
                        );
                    }
                }
            }
        });
    }

    #[cold]
    fn first_use(&self, dev: CUdevice, driver: &Driver, config: &Config) -> &DeviceBudget {
        self.check_ordinals(driver, config);
        let Some(slot) = usize::try_from(dev).ok().and_then(|d| self.slots.get(d)) else {
            log_at!(
                Warn,
                "device ordinal {dev} is beyond {MAX_DEVICES}: no limit applies to it"
            );
            return &self.overflow;
        };
        slot.get_or_init(|| {
            let resolve = |what: &str, spec: Option<crate::base::config::Limit>| -> u64 {
                let Some(spec) = spec else { return 0 };
                if let crate::base::config::Limit::Bytes(b) = spec {
                    return b;
                }
                match driver.device_total_mem(dev) {
                    Ok(total) => spec.resolve(total),
                    Err(e) => {
                        // Fail closed: a limit we cannot compute allows nothing.
                        log_at!(Error, "device {dev}: cannot read total memory (error {e}) to resolve the {what}; allowing no memory");
                        1
                    }
                }
            };
            let hard = resolve("memory limit", config.memory_limit.for_device(dev as u32));
            let soft = resolve("soft limit", config.soft_limit.for_device(dev as u32));
            if hard != 0 {
                log_at!(Info, "device {dev}: memory limit {}", fmt_bytes(hard));
                // A limit the device cannot reach limits nothing: said, not silently kept.
                if let Ok(total) = driver.device_total_mem(dev) {
                    if hard > total {
                        log_at!(
                            Warn,
                            "device {dev}: the memory limit {} is above the device's {}: it never applies",
                            fmt_bytes(hard),
                            fmt_bytes(total)
                        );
                    }
                }
            }
            let budget = DeviceBudget::new(hard, soft);
            if let Some(group) = &self.group {
                let named = config
                    .group_limit
                    .for_device(dev as u32)
                    .map(|l| resolve("group limit", Some(l)));
                let uuid = self.uuid(dev, driver).unwrap_or_else(|| {
                    log_at!(Warn, "device {dev}: the driver gives no UUID; the group matches it by ordinal");
                    let mut u = [0xffu8; 16];
                    u[12..].copy_from_slice(&dev.to_le_bytes());
                    u
                });
                let device = group.device(uuid, named, config.group_fixed).map(|d| {
                    // The mandatory mode: the job's share checked against the driver's figure
                    // for the job too (its ledger is the user's to write).
                    match (&config.job, config.group_fixed) {
                        (Some(job), true) => {
                            d.witnessed_by(std::sync::Arc::new(super::job_witness::JobWitness {
                                job: job.clone(),
                            }))
                        }
                        _ => d,
                    }
                });
                match device {
                    Ok(share) => {
                        // The group holds each member's whole footprint: its context and what
                        // the driver took before cudapool saw the device, as NVML counts the
                        // process (CUDAPOOL_GROUP_LIMIT). Charged to the group alone:
                        // the process's own limit keeps its meaning.
                        let context = crate::driver::nvml::process_used(&uuid, std::process::id())
                            .map_or(0, |used| used.saturating_sub(budget.reserved()));
                        if context > 0 {
                            share.force_reserve(context);
                            log_at!(
                                Info,
                                "device {dev}: the group counts this process's context, {} (NVML)",
                                fmt_bytes(context)
                            );
                        }
                        budget.share(Box::new(share.clone()));
                        let _ = self.shares[dev as usize].set(share);
                    }
                    Err(e) => {
                        // Fail closed: a group limit we cannot keep allows nothing.
                        log_at!(Error, "device {dev}: {e}; allowing no memory");
                        budget.set_hard_limit(1);
                    }
                }
            }
            budget
        })
    }

    /// Device `dev`'s UUID, asked of the driver once.
    pub fn uuid(&self, dev: CUdevice, driver: &Driver) -> Option<[u8; 16]> {
        let slot = self.uuids.get(usize::try_from(dev).ok()?)?;
        *slot.get_or_init(|| driver.device_uuid(dev))
    }

    /// Devices whose budget exists.
    pub fn seen(&self) -> Vec<CUdevice> {
        (0..MAX_DEVICES)
            .filter(|&d| self.slots[d].get().is_some())
            .map(|d| d as CUdevice)
            .collect()
    }
}
