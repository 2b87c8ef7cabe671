//! Limits: a device's budget ([`budget`]: what is charged against the hard limit, and the
//! counters the stats read) and groups of processes sharing one budget ([`group`]: the ledger
//! file and the protocol its members follow). Mechanisms: they know nothing of pools,
//! contexts or the driver.

pub mod budget;
pub mod group;
