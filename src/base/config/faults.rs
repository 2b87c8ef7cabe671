//! `CUDAPOOL_FAULTS` (a debug setting, README): driver calls made to fail.

/// One `CUDAPOOL_FAULTS` entry: the `from`-th to the `to`-th call (counted from 1, both
/// included) that cudapool makes to the driver's entry point `call` return `code` instead of
/// reaching the driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub call: String,
    pub from: u64,
    pub to: u64,
    pub code: u32,
}

impl Fault {
    pub const ACCEPTED: &'static str = "a comma-separated list of NAME@N (the N-th call), NAME@N-M (the N-th to the M-th) or NAME@N+ (the N-th and every later one), each optionally followed by =CODE (a CUresult; default 2, out of memory, for an entry point named with Alloc or Create, else 999), NAME a driver entry point cudapool calls (cuMemAlloc_v2, cuEventRecord, ...)";

    /// The error a fault returns when its entry does not say: what an allocation fails with,
    /// or CUDA_ERROR_UNKNOWN.
    fn default_code(call: &str) -> u32 {
        if call.contains("Alloc") || call.contains("Create") {
            2
        } else {
            999
        }
    }
}

/// Parses `CUDAPOOL_FAULTS` (see [`Fault::ACCEPTED`]); the names are checked against the
/// driver's table by the caller.
pub fn parse_faults(s: &str) -> Result<Vec<Fault>, String> {
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (spec, code) = match item.split_once('=') {
            Some((spec, code)) => {
                let code = code
                    .trim()
                    .parse::<u32>()
                    .map_err(|_| format!("{code:?} is not a CUresult"))?;
                (spec.trim(), Some(code))
            }
            None => (item, None),
        };
        let (call, when) = spec
            .split_once('@')
            .ok_or_else(|| format!("{item:?} names no call (NAME@N)"))?;
        let call = call.trim();
        if !call.starts_with("cu") || !call.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("{call:?} is not a driver entry point"));
        }
        let count = |n: &str| match n.trim().parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("{n:?} is not a call count (1, 2, ...)")),
        };
        let when = when.trim();
        let (from, to) = if let Some(n) = when.strip_suffix('+') {
            (count(n)?, u64::MAX)
        } else if let Some((a, b)) = when.split_once('-') {
            (count(a)?, count(b)?)
        } else {
            let n = count(when)?;
            (n, n)
        };
        if to < from {
            return Err(format!("{when:?} ends before it begins"));
        }
        out.push(Fault {
            code: code.unwrap_or_else(|| Fault::default_code(call)),
            call: call.to_string(),
            from,
            to,
        });
    }
    if out.is_empty() {
        return Err("no fault listed".into());
    }
    Ok(out)
}
