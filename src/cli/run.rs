//! `cudapool run [--limit SIZE] [--pool KIND] [--report] -- program args...`: sets `LD_PRELOAD`
//! and the variables, then execs the program. Everything it passes on is checked first with the
//! library's own parser (its options and every `CUDAPOOL_*` variable of the environment): a bad
//! value, an unknown `CUDAPOOL_*` name or a file that cannot be written exits 2 with the
//! library's own message, before anything runs. 127: the program was
//! not found; 126: it could not be started.

use cudapool::base::config::{names, parse_device_limits, Config, PoolKind, SIZE_FORMS};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

/// `--limit`, checked as `CUDAPOOL_MEMORY_LIMIT` would be.
pub fn parse_limit_arg(s: &str) -> Result<String, String> {
    parse_device_limits(s).map_err(|why| format!("{why}; accepted: {SIZE_FORMS}"))?;
    // A bare number is bytes: `--limit 256` is 256 bytes, which no allocation fits. Below
    // 1 MiB without a unit it is surely a slip: refused with the remedy.
    for part in s.split(',') {
        let size = part.rsplit_once('=').map_or(part, |(_, v)| v).trim();
        if let Ok(n) = size.parse::<u64>() {
            if n > 0 && n < 1 << 20 {
                return Err(format!(
                    "{size} is {size} bytes, less than 1 MiB: did you mean {size}MiB or {size}GiB? (write {size}B if you mean bytes)"
                ));
            }
        }
    }
    Ok(s.to_string())
}

/// `--pool`, checked as `CUDAPOOL_POOL` would be.
pub fn parse_pool_arg(s: &str) -> Result<String, String> {
    PoolKind::parse(s)
        .map(|_| s.to_string())
        .ok_or_else(|| format!("unknown pool kind; accepted: {}", PoolKind::ACCEPTED))
}

/// `$CUDAPOOL_LIB`, else `libcudapool.so` beside this binary, in `../lib`, or (installed by
/// `pip`, this binary in a `bin/` folder) in the `cudapool` package of that prefix's Python
/// (`../lib/python3.*/site-packages/cudapool/`, or `dist-packages` on Debian's Python).
pub fn find_library() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("CUDAPOOL_LIB") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            is_cudapool(&p).map(|()| p)
        } else {
            Err(format!("CUDAPOOL_LIB={} is not a file", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find myself: {e}"))?;
    let dir = exe.parent().ok_or("binary has no folder")?;
    let mut candidates = vec![
        dir.join("libcudapool.so"),
        dir.join("../lib/libcudapool.so"),
    ];
    candidates.extend(pip_installed(&dir.join("../lib")));
    for candidate in &candidates {
        if candidate.is_file() {
            return candidate
                .canonicalize()
                .map_err(|e| format!("{}: {e}", candidate.display()));
        }
    }
    Err(format!(
        "libcudapool.so not found (tried {}); set CUDAPOOL_LIB",
        candidates
            .iter()
            .map(|c| c.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// Whether `CUDAPOOL_LIB`'s file is a cudapool library: a shared object (ELF, type `ET_DYN`)
/// that holds cudapool's C API. Anything else would be preloaded for nothing (the loader
/// skips what it cannot load and the program runs without cudapool, status 0).
fn is_cudapool(p: &std::path::Path) -> Result<(), String> {
    use std::io::Read as _;
    let not = |why: &str| Err(format!("CUDAPOOL_LIB={}: {why}", p.display()));
    let mut bytes = Vec::new();
    // A library is a few MiB; the bound keeps a huge file from being read whole.
    let read = std::fs::File::open(p).and_then(|f| f.take(512 << 20).read_to_end(&mut bytes));
    if let Err(e) = read {
        return not(&e.to_string());
    }
    let elf_so = bytes.len() > 18 && bytes.starts_with(b"\x7fELF") && bytes[16..18] == [3, 0];
    if !elf_so {
        return not("not a shared library (point it at libcudapool.so)");
    }
    if !bytes.windows(19).any(|w| w == b"cudapool_get_stats\0") {
        return not("a shared library, but not cudapool's (it has no cudapool_get_stats)");
    }
    Ok(())
}

/// `lib/python3.*/{site,dist}-packages/cudapool/libcudapool.so` under `lib`, newest Python
/// first.
fn pip_installed(lib: &std::path::Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(lib) else {
        return Vec::new();
    };
    let mut pythons: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("python3"))
        })
        .collect();
    pythons.sort();
    pythons
        .iter()
        .rev()
        .flat_map(|py| {
            ["site-packages", "dist-packages"]
                .map(|d| py.join(d).join("cudapool").join("libcudapool.so"))
        })
        .collect()
}

pub fn run(
    limit: Option<String>,
    pool: Option<String>,
    report: bool,
    program: Vec<OsString>,
) -> ExitCode {
    let fail = |code: u8, msg: String| {
        eprintln!("cudapool run: {msg}");
        ExitCode::from(code)
    };
    // What the library will read, checked now with its own parser.
    let set: [(&str, Option<String>); 3] = [
        ("CUDAPOOL_MEMORY_LIMIT", limit),
        ("CUDAPOOL_POOL", pool),
        ("CUDAPOOL_REPORT", report.then(|| "stderr".to_string())),
    ];
    let lookup = |name: &str| {
        set.iter()
            .find(|(n, v)| *n == name && v.is_some())
            .and_then(|(_, v)| v.clone())
            .or_else(|| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    };
    let config = match Config::from_lookup(lookup) {
        Ok(c) => c,
        Err(e) => return fail(2, e.to_string()),
    };
    // A leftover CUDAPOOL_DISABLE in the environment turns off what this command was asked to
    // do: never silently.
    if config.disable {
        let asked: Vec<&str> = set
            .iter()
            .filter(|(_, v)| v.is_some())
            .map(|(n, _)| option_of(n))
            .collect();
        let value = std::env::var("CUDAPOOL_DISABLE").unwrap_or_default();
        return fail(
            2,
            format!(
                "CUDAPOOL_DISABLE={value} in the environment turns cudapool off{}: unset it (unset CUDAPOOL_DISABLE) to run the program under cudapool, or run the program without `cudapool run`",
                if asked.is_empty() {
                    String::new()
                } else {
                    format!(", so {} would do nothing", asked.join(" and "))
                }
            ),
        );
    }
    // What the library would only warn of, refused here before anything runs: a misspelt
    // name, a file it could not write at exit, a soft limit that never applies.
    let names: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .collect();
    let mut problems = names::unknown(names.iter().map(String::as_str));
    problems.extend(config.notes());
    // The runtime folder the program will publish in, made now as the program would (a folder
    // it cannot use, such as one under another user's home, is refused before it starts).
    if let Some(p) = &config.runtime_dir {
        if let Err(e) = cudapool::base::rundir_find::mine(Some(p)) {
            problems.push(e);
        }
    }
    if !problems.is_empty() {
        for p in &problems {
            eprintln!("cudapool run: {p}");
        }
        eprintln!(
            "cudapool run: the program was not started: correct or unset what is named above"
        );
        return ExitCode::from(2);
    }
    // An option replaces the variable of the environment: said, never silent.
    for (name, value) in &set {
        if let (Some(v), Some(old)) = (value, std::env::var_os(name)) {
            if old.to_string_lossy() != v.as_str() && *name != "CUDAPOOL_REPORT" {
                eprintln!(
                    "cudapool run: {} {v} replaces {name}={} of the environment",
                    option_of(name),
                    old.to_string_lossy()
                );
            }
        }
    }
    // The limit in bytes under --report, and always when a unit was decimal (`256M` is
    // 244.14 MiB, where Slurm's `256M` is 256 MiB): never only a surprise later.
    let decimal = set[0].1.as_deref().is_some_and(decimal_unit);
    let l = &config.memory_limit;
    if (report || decimal) && (l.all.is_some() || !l.per_device.is_empty()) {
        let note = if decimal {
            " (k, M, G and T are powers of 1000; KiB, MiB, GiB and TiB powers of 1024)"
        } else {
            ""
        };
        eprintln!("cudapool run: memory limit {}{note}", l.words());
    }
    let lib = match find_library() {
        Ok(l) => l,
        Err(e) => return fail(2, e),
    };
    let mut preload = OsString::from(&lib);
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let mut cmd = Command::new(&program[0]);
    cmd.args(&program[1..]).env("LD_PRELOAD", preload);
    // The program keeps this pid after the exec: under --report it says at exit when it asked
    // CUDA for no memory (`report::say_when_unused`).
    cmd.env("CUDAPOOL_RUN_PID", std::process::id().to_string());
    for (name, value) in &set {
        if let Some(v) = value {
            cmd.env(name, v);
        }
    }
    let err = cmd.exec();
    let code = if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    };
    fail(code, cannot_run(&program[0], &err))
}

/// Whether a size list names a decimal unit (`256M`, `1.5GB`, `2t`): a letter k, m, g or t
/// after a figure that no `i` follows.
fn decimal_unit(v: &str) -> bool {
    let b = v.as_bytes();
    (1..b.len()).any(|i| {
        matches!(b[i].to_ascii_lowercase(), b'k' | b'm' | b'g' | b't')
            && (b[i - 1].is_ascii_digit() || b[i - 1] == b' ')
            && !matches!(b.get(i + 1), Some(b'i' | b'I'))
    })
}

/// The option of `cudapool run` that sets variable `name`.
fn option_of(name: &str) -> &'static str {
    match name {
        "CUDAPOOL_MEMORY_LIMIT" => "--limit",
        "CUDAPOOL_POOL" => "--pool",
        _ => "--report",
    }
}

/// Why `program` did not start, in the user's terms: a bare name is looked for on `PATH` only
/// (as a shell does), so a file of that name here is no program until it is named by its path.
fn cannot_run(program: &std::ffi::OsStr, err: &std::io::Error) -> String {
    let name = program.to_string_lossy();
    let here = std::path::Path::new(program);
    let bare = !name.contains('/');
    match err.kind() {
        std::io::ErrorKind::NotFound if bare && here.is_file() => format!(
            "cannot run {name}: no program {name} on PATH (a bare name is looked for there only); to run the file {name} here, name it by its path: ./{name}"
        ),
        std::io::ErrorKind::NotFound if bare => {
            format!("cannot run {name}: no program {name} on PATH")
        }
        std::io::ErrorKind::NotFound => format!("cannot run {name}: no such file"),
        std::io::ErrorKind::PermissionDenied if here.is_dir() => {
            format!("cannot run {name}: it is a folder")
        }
        std::io::ErrorKind::PermissionDenied => match std::fs::metadata(here) {
            // Its own bits are fine or unknown: a folder on its way is closed to this user.
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => format!(
                "cannot run {name}: a folder on its path cannot be entered by this user ({e})"
            ),
            Ok(m) if std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0 => {
                format!(
                    "cannot run {name}: permission denied though it is executable (a folder on its path closed to this user, or a file system mounted noexec)"
                )
            }
            _ => format!(
                "cannot run {name}: it is not executable (chmod +x {name}, or run it through its interpreter)"
            ),
        },
        _ => format!("cannot run {name}: {err}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_units_are_told_from_binary_ones() {
        for v in ["256M", "1.5GB", "2t", "0=300M,1=50%", "512 k"] {
            assert!(decimal_unit(v), "{v}");
        }
        for v in [
            "256MiB",
            "8GiB",
            "50%",
            "0=8GiB,1=50%",
            "1073741824",
            "1.5gib",
        ] {
            assert!(!decimal_unit(v), "{v}");
        }
    }
}
