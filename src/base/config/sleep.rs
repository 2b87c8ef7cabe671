//! The settings of sleep and wake (`CUDAPOOL_WAKE_TIMEOUT`, `CUDAPOOL_SLEEP_IDLE`,
//! `CUDAPOOL_MEMORY_REQUEST`, `CUDAPOOL_SUSPEND`), and DURATION values: `500ms`, `30s`, `5m`, `1h`, or plain seconds
//! (`30`), decimals allowed (`1.5s`).

use super::{parse_device_limits, ConfigError, DeviceLimits, SIZE_FORMS};
use std::time::Duration;

/// How long a wake waits for room by default (`CUDAPOOL_WAKE_TIMEOUT`).
pub const WAKE_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Clone, Debug, PartialEq)]
pub struct SleepSettings {
    /// How long a call that wakes the process waits for room (`None`: for ever).
    pub wake_timeout: Option<Duration>,
    /// In a group: before this process's allocation is refused, members idle this long (and
    /// above their request) are put to sleep. `None`: nobody is, but by command or API.
    pub idle: Option<Duration>,
    /// In a group: this member's floor; at or below it, it is never put to sleep for another.
    pub request: DeviceLimits,
    /// `CUDAPOOL_SUSPEND`: whether the process sleeps when it is stopped (SIGTSTP: Slurm's
    /// suspend, a shell's Ctrl-Z) or its group is suspended; `None`: the default, which is
    /// yes in a Slurm job's group and no elsewhere (`Config::suspend_sleeps`).
    pub suspend: Option<bool>,
    /// `CUDAPOOL_SLEEP_READY=1`: host memory as large as what the process holds on its GPUs is
    /// made ahead of a sleep (its pages faulted, then lent to the kernel), so that a first sleep
    /// copies into pages already there. Off by default: it costs an awake process that memory.
    pub ready: bool,
}

impl Default for SleepSettings {
    fn default() -> Self {
        SleepSettings {
            wake_timeout: Some(WAKE_TIMEOUT),
            idle: None,
            request: DeviceLimits::default(),
            suspend: None,
            ready: false,
        }
    }
}

impl SleepSettings {
    /// Reads the sleep variables through `get` (an empty value is unset).
    pub(super) fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let bad =
            |var: &'static str, value: &str, why: String, accepted: &'static str| ConfigError {
                var,
                value: value.to_string(),
                why,
                accepted,
            };
        let duration = |var: &'static str| -> Result<Option<Duration>, ConfigError> {
            get(var)
                .map(|v| parse_duration(&v).map_err(|why| bad(var, &v, why, DURATION_FORMS)))
                .transpose()
        };
        let mut s = SleepSettings::default();
        if let Some(d) = duration("CUDAPOOL_WAKE_TIMEOUT")? {
            s.wake_timeout = (!d.is_zero()).then_some(d);
        }
        s.idle = duration("CUDAPOOL_SLEEP_IDLE")?;
        if let Some(v) = get("CUDAPOOL_MEMORY_REQUEST") {
            s.request = parse_device_limits(&v)
                .map_err(|why| bad("CUDAPOOL_MEMORY_REQUEST", &v, why, SIZE_FORMS))?;
        }
        if let Some(v) = get("CUDAPOOL_SUSPEND") {
            s.suspend = match v.trim().to_ascii_lowercase().as_str() {
                "sleep" => Some(true),
                "keep" => Some(false),
                _ => {
                    return Err(bad(
                        "CUDAPOOL_SUSPEND",
                        &v,
                        "neither sleep nor keep".into(),
                        SUSPEND_FORMS,
                    ))
                }
            };
        }
        if let Some(v) = get("CUDAPOOL_SLEEP_READY") {
            s.ready = match v.trim() {
                "1" => true,
                "0" => false,
                _ => {
                    return Err(bad(
                        "CUDAPOOL_SLEEP_READY",
                        &v,
                        "neither 0 nor 1".into(),
                        READY_FORMS,
                    ))
                }
            };
        }
        Ok(s)
    }
}

pub const READY_FORMS: &str =
    "1 (host memory for a sleep made ahead, while awake) or 0 (made by the sleep, the default)";

pub const SUSPEND_FORMS: &str =
    "sleep (a stopped process gives its GPU memory back until it continues) or keep";

pub const DURATION_FORMS: &str =
    "milliseconds (500ms), seconds (30s or 30), minutes (5m), hours (1h), decimals allowed (1.5s)";

/// The duration `s` names, or why not.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let seconds_per: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => return Err(format!("unknown unit {other:?}")),
    };
    let n: f64 = number
        .parse()
        .map_err(|_| format!("{number:?} is not a number"))?;
    let secs = n * seconds_per;
    if !secs.is_finite() || secs > 1e9 {
        return Err("too long".into());
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_every_unit_and_bad_ones_refused() {
        let ms = Duration::from_millis;
        assert_eq!(parse_duration("500ms"), Ok(ms(500)));
        assert_eq!(parse_duration("30s"), Ok(ms(30_000)));
        assert_eq!(parse_duration(" 30 "), Ok(ms(30_000)));
        assert_eq!(parse_duration("1.5s"), Ok(ms(1_500)));
        assert_eq!(parse_duration("5m"), Ok(ms(300_000)));
        assert_eq!(parse_duration("1H"), Ok(ms(3_600_000)));
        assert_eq!(parse_duration("0"), Ok(ms(0)));
        for bad in ["", "s", "-1s", "1d", "1.2.3s", "1e3", "99999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn suspend_is_sleep_or_keep() {
        let read = |v: &'static str| {
            SleepSettings::from_lookup(&move |k: &str| (k == "CUDAPOOL_SUSPEND").then(|| v.into()))
        };
        assert_eq!(read("sleep").unwrap().suspend, Some(true));
        assert_eq!(read(" KEEP ").unwrap().suspend, Some(false));
        let e = read("yes").unwrap_err();
        assert_eq!(e.var, "CUDAPOOL_SUSPEND");
        assert_eq!(SleepSettings::default().suspend, None);
    }
}
