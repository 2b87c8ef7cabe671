//! What NVML says of a GPU's memory under cudapool (`hooks::nvml` asks): the budget, for a GPU
//! with a limit, wherever the job looks (nvidia-smi, pynvml, vLLM's and DeepSpeed's memory
//! reports). For a GPU with a limit: total = the limit (the group's for a member of a group with
//! a limit there), used = what the process (the group) holds from the driver, free = the room
//! left, never more than the device has free. GPUs without a limit are untouched.
//!
//! Devices are matched by UUID (NVML's index is not CUDA's ordinal). In a process that uses
//! CUDA, the figures are its budgets' and its group's; in one that does not (nvidia-smi under
//! `cudapool run --limit`), they come from its settings: a bare SIZE applies to every GPU, a
//! per-device list is matched through the driver (`cuInit`, then each ordinal's UUID), a
//! group's figures are read from its ledger, and used is what the programs started by the same
//! `cudapool run` hold (nvidia-smi in the shell of `cudapool run --limit 8GiB -- bash`).

use super::Shim;
use crate::base::config::{Config, Limit};
use crate::base::cu::CUdevice;
use crate::driver::Driver;

/// A GPU's memory as NVML should show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NvmlView {
    pub total: u64,
    pub used: u64,
    pub free: u64,
}

/// The view of the GPU `uuid`, whose real total and free bytes are `total` and `free`; `None`
/// when no limit applies to it (NVML's own answer stands).
pub fn view(uuid: &[u8; 16], total: u64, free: u64) -> Option<NvmlView> {
    let config = match super::config() {
        Ok(c) if !c.disable => c,
        _ => return None,
    };
    // (limit, held) of the process and of its group on this GPU; 0: no limit.
    let (own, group) = match Shim::if_set_up() {
        Some(shim) => shim.own_and_group(uuid),
        None => (
            settings_limit(uuid, total, config).map_or((0, 0), |l| {
                (
                    l,
                    if l != 0 {
                        same_run_held(uuid, config)
                    } else {
                        0
                    },
                )
            }),
            ledger_figures(uuid, config),
        ),
    };
    let room = |(limit, held): (u64, u64)| limit.saturating_sub(held);
    let (limit, held, room) = match (own, group) {
        (_, (g, held)) if g != 0 => {
            let own_room = if own.0 != 0 { room(own) } else { u64::MAX };
            (g, held, room((g, held)).min(own_room))
        }
        ((l, held), _) if l != 0 => (l, held, room((l, held))),
        _ => return None,
    };
    let limit = limit.min(total);
    Some(NvmlView {
        total: limit,
        used: held.min(limit),
        free: room.min(free).min(limit),
    })
}

impl Shim {
    /// (hard limit, reserved) of this process and of its group on the GPU `uuid` (0, 0 where
    /// none): from the budget of the ordinal that has that UUID.
    fn own_and_group(&self, uuid: &[u8; 16]) -> ((u64, u64), (u64, u64)) {
        let Some(dev) = ordinal_of(self.driver, uuid) else {
            return ((0, 0), (0, 0));
        };
        let budget = self.budget(dev);
        let own = (budget.hard_limit().raw(), budget.reserved());
        let group = self
            .group_figures(dev)
            .map_or((0, 0), |g| (g.limit, g.reserved));
        (own, group)
    }
}

/// The CUDA ordinal whose device has UUID `uuid`, as this process sees them.
fn ordinal_of(driver: &Driver, uuid: &[u8; 16]) -> Option<CUdevice> {
    let n = driver.device_count()?;
    (0..n).find(|&d| driver.device_uuid(d).as_ref() == Some(uuid))
}

/// The hard limit the settings give the GPU `uuid` in a process that has not used CUDA.
fn settings_limit(uuid: &[u8; 16], total: u64, config: &Config) -> Option<u64> {
    let resolve = |l: Limit| l.resolve(total);
    if config.memory_limit.per_device.is_empty() {
        return config.memory_limit.all.map(resolve);
    }
    let driver = Driver::get()?;
    if !driver.init() {
        return config.memory_limit.all.map(resolve);
    }
    let dev = ordinal_of(driver, uuid)?;
    config.memory_limit.for_device(dev as u32).map(resolve)
}

/// (limit, held by its live members) of the process's group on the GPU `uuid`, read from the
/// ledger (a process that has not joined: it never uses CUDA).
fn ledger_figures(uuid: &[u8; 16], config: &Config) -> (u64, u64) {
    let Some(name) = &config.group else {
        return (0, 0);
    };
    let Ok((dir, _)) = crate::base::rundir_find::mine(config.runtime_dir.as_deref()) else {
        return (0, 0);
    };
    match crate::limits::group::ledger::read(&dir, &crate::limits::group::ledger::file_name(name)) {
        Ok(v) => v
            .devices
            .iter()
            .find(|(u, _, _)| u == uuid)
            .map_or((0, 0), |&(_, limit, held)| (limit, held)),
        Err(_) => (0, 0),
    }
}

/// What the live cudapool processes of this user started by the same `cudapool run` as this
/// one (their `CUDAPOOL_RUN_PID` is this process's) hold on the GPU `uuid`, as their pages say
/// (read by the observer: pages are reporting's); 0 outside `cudapool run`.
fn same_run_held(uuid: &[u8; 16], config: &Config) -> u64 {
    let Some(run) = std::env::var_os("CUDAPOOL_RUN_PID") else {
        return 0;
    };
    super::shim::observer().map_or(0, |o| {
        o.run_held(uuid, run.as_encoded_bytes(), config.runtime_dir.as_deref())
    })
}
