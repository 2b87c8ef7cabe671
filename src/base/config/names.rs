//! The `CUDAPOOL_*` names cudapool knows, and the nearest one to a name it does not (an
//! unknown name is a bad value too, said once with the nearest known name).

/// Every variable the library, the `cudapool` command or the deployment files read or set.
pub const KNOWN: &[&str] = &[
    "CUDAPOOL_MEMORY_LIMIT",
    "CUDAPOOL_POOL",
    "CUDAPOOL_SOFT_LIMIT",
    "CUDAPOOL_REUSE",
    "CUDAPOOL_REPORT",
    "CUDAPOOL_TRACK",
    "CUDAPOOL_HISTORY",
    "CUDAPOOL_TRACE",
    "CUDAPOOL_LOG",
    "CUDAPOOL_DISABLE",
    "CUDAPOOL_GROUP",
    "CUDAPOOL_GROUP_LIMIT",
    "CUDAPOOL_SEGMENTS",
    "CUDAPOOL_STITCH",
    "CUDAPOOL_RUNTIME_DIR",
    "CUDAPOOL_OOM_SNAPSHOT",
    "CUDAPOOL_OOM_SNAPSHOT_KEEP",
    "CUDAPOOL_WAKE_TIMEOUT",
    "CUDAPOOL_SLEEP_IDLE",
    "CUDAPOOL_MEMORY_REQUEST",
    "CUDAPOOL_CACHE_IDLE",
    "CUDAPOOL_SUSPEND",
    "CUDAPOOL_SLEEP_READY",
    // A debug setting (README): driver calls made to fail.
    "CUDAPOOL_FAULTS",
    // `cudapool run`: where the library is, when not beside the command.
    "CUDAPOOL_LIB",
    // Set by `cudapool run`: the pid of the program it started.
    "CUDAPOOL_RUN_PID",
    // `cudapool slurm`: the site's settings, when not at /etc/cudapool/slurm.conf.
    "CUDAPOOL_SLURM_CONFIG",
];

/// Names people write for the hard limit (`cudapool run --limit`): a plain edit distance would
/// send them to the soft limit, which is one edit nearer.
const LIMIT_ALIASES: &[&str] = &[
    "LIMIT",
    "MEM_LIMIT",
    "MEMORY",
    "MEM",
    "HARD_LIMIT",
    "MAX_MEMORY",
    "MEMORY_LIMITS",
    "MEMLIMIT",
];

/// The known name nearest to `name` (which starts with `CUDAPOOL_`), if any is near at all.
pub fn nearest(name: &str) -> Option<&'static str> {
    let rest = name.strip_prefix("CUDAPOOL_").unwrap_or(name);
    let upper = rest.to_ascii_uppercase();
    if LIMIT_ALIASES.contains(&upper.as_str()) {
        return Some("CUDAPOOL_MEMORY_LIMIT");
    }
    let (best, d) = KNOWN
        .iter()
        .map(|k| (*k, distance(&upper, &k["CUDAPOOL_".len()..])))
        .min_by_key(|&(_, d)| d)?;
    // Nothing in common is no suggestion.
    (d <= upper.len().max(4) / 2 + 2).then_some(best)
}

/// The `CUDAPOOL_*` names among `names` that cudapool does not know, each with one line that
/// names the nearest known one.
pub fn unknown<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = names
        .into_iter()
        .filter(|n| n.starts_with("CUDAPOOL_") && !KNOWN.contains(n))
        .map(|n| match nearest(n) {
            Some(k) => format!("unknown variable {n}: did you mean {k}? (it has no effect)"),
            None => format!(
                "unknown variable {n} (it has no effect); `cudapool --help` and `man cudapool` list the variables"
            ),
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Levenshtein's edit distance.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let here = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(here + 1);
            prev = here;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nearest_name() {
        assert_eq!(nearest("CUDAPOOL_LIMIT"), Some("CUDAPOOL_MEMORY_LIMIT"));
        assert_eq!(
            nearest("CUDAPOOL_MEMORY_LIMT"),
            Some("CUDAPOOL_MEMORY_LIMIT")
        );
        assert_eq!(nearest("CUDAPOOL_POLL"), Some("CUDAPOOL_POOL"));
        assert_eq!(nearest("CUDAPOOL_GROUPLIMIT"), Some("CUDAPOOL_GROUP_LIMIT"));
        assert_eq!(nearest("CUDAPOOL_SEGMENT"), Some("CUDAPOOL_SEGMENTS"));
        assert_eq!(nearest("CUDAPOOL_XYZZYQWERTY_PLUGH"), None);
    }

    #[test]
    fn only_unknown_names_are_said() {
        let lines = unknown(["CUDAPOOL_POOL", "PATH", "CUDAPOOL_LIMIT", "CUDAPOOL_LIMIT"]);
        assert_eq!(
            lines,
            vec!["unknown variable CUDAPOOL_LIMIT: did you mean CUDAPOOL_MEMORY_LIMIT? (it has no effect)".to_string()]
        );
    }
}
