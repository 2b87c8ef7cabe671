//! The manual: every variable in one table (for `cudapool --help` and the man page), and the
//! man pages and shell completions generated from the command's own definition (clap_mangen,
//! clap_complete) by the hidden `cudapool manual DIR`, into the layout a prefix installs
//! (`share/man/man1`, `share/bash-completion/completions`, `share/zsh/site-functions`,
//! `share/fish/vendor_completions.d`). The repository keeps the generated files in `share/`
//! (the wheel installs them from there); a test regenerates them and compares.

use std::io::Write as _;
use std::path::Path;

/// Every variable cudapool reads or sets: name, values, what it does. Each name of the
/// library's own list (`names::KNOWN`) is here, and nothing else (tested).
pub const VARIABLES: &[(&str, &str, &str)] = &[
    (
        "CUDAPOOL_MEMORY_LIMIT",
        "SIZE or list",
        "hard limit on this process's device memory per device, cached memory included (--limit)",
    ),
    (
        "CUDAPOOL_SOFT_LIMIT",
        "SIZE or list",
        "above this much reserved memory, freed blocks go back to the driver",
    ),
    (
        "CUDAPOOL_CACHE_IDLE",
        "DURATION",
        "cached memory nothing reuses for this long goes back to the driver (default 2s; 0: at once; never: kept until pressure); a free with no allocation following it lately goes back at once",
    ),
    (
        "CUDAPOOL_POOL",
        "split|binned|simple|none",
        "the pool kind (--pool); split is the default",
    ),
    (
        "CUDAPOOL_SEGMENTS",
        "expandable|classic",
        "how split takes memory above 1 MiB; expandable is the default",
    ),
    (
        "CUDAPOOL_STITCH",
        "near-limit|always",
        "when an expandable arena maps its free blocks' memory again: near a limit (default) or at every growth",
    ),
    (
        "CUDAPOOL_REUSE",
        "auto|immediate",
        "auto never reuses a block earlier device work may still touch",
    ),
    (
        "CUDAPOOL_REPORT",
        "1|yes|stderr|0|no|FILE",
        "print the memory status at exit (--report)",
    ),
    (
        "CUDAPOOL_TRACK",
        "0|1|2",
        "list leaks at exit; 2 with the frames that made each allocation",
    ),
    (
        "CUDAPOOL_HISTORY",
        "N",
        "keep the last N allocator events per device, for snapshots",
    ),
    (
        "CUDAPOOL_TRACE",
        "FILE",
        "write a trace of memory over time at exit (cudapool plot draws it)",
    ),
    (
        "CUDAPOOL_LOG",
        "error|warn|info|debug",
        "diagnostics on stderr; warn is the default",
    ),
    (
        "CUDAPOOL_DISABLE",
        "1",
        "load, but pass everything through untouched",
    ),
    (
        "CUDAPOOL_GROUP",
        "NAME",
        "share one budget per GPU with this user's processes that name it",
    ),
    (
        "CUDAPOOL_GROUP_LIMIT",
        "SIZE or list",
        "the group's hard limit per GPU",
    ),
    (
        "CUDAPOOL_RUNTIME_DIR",
        "DIR",
        "where live pages and group ledgers live (default /dev/shm/cudapool-UID)",
    ),
    (
        "CUDAPOOL_OOM_SNAPSHOT",
        "FILE (%p, %n)",
        "write a snapshot at each out-of-memory answer",
    ),
    (
        "CUDAPOOL_OOM_SNAPSHOT_KEEP",
        "N",
        "keep the last N such snapshots (16 by default)",
    ),
    (
        "CUDAPOOL_WAKE_TIMEOUT",
        "DURATION",
        "how long a call that wakes a sleeping process waits for room in its limits (500ms, 30s, 5m; default 60s; 0 waits for ever); then CUDA_ERROR_OUT_OF_MEMORY, the contents staying on the host",
    ),
    (
        "CUDAPOOL_SLEEP_IDLE",
        "DURATION",
        "in a group: before this member's allocation is refused, members idle this long (and above their request) are put to sleep, longest idle first; unset: nobody is but by cudapool sleep or the API",
    ),
    (
        "CUDAPOOL_MEMORY_REQUEST",
        "SIZE",
        "in a group: this member's floor; at or under it, it is never put to sleep for another member",
    ),
    (
        "CUDAPOOL_SUSPEND",
        "sleep|keep",
        "sleep: a process stopped by SIGTSTP (Slurm's suspend, Ctrl-Z) first gives its GPU memory back, and in a group the whole group sleeps until it continues; the default in a Slurm job (its group slurm-ID), keep elsewhere",
    ),
    (
        "CUDAPOOL_SLEEP_READY",
        "0|1",
        "1: while awake, host memory as large as the process holds on its GPUs is made ahead (lent to the kernel, which may take it back), so that a first sleep copies into pages already there; costs that much resident host memory; 0 (the default): the sleep makes it",
    ),
    (
        "CUDAPOOL_FAULTS",
        "CALL=N,...",
        "debugging: make the named driver calls fail",
    ),
    (
        "CUDAPOOL_LIB",
        "FILE",
        "cudapool run: the library to preload, when not beside the command",
    ),
    (
        "CUDAPOOL_RUN_PID",
        "PID",
        "set by cudapool run: the pid of the program it started",
    ),
    (
        "CUDAPOOL_SLURM_CONFIG",
        "FILE",
        "cudapool slurm: the site's settings (default /etc/cudapool/slurm.conf)",
    ),
];

/// SIZE's forms, said where sizes are (decimal units are powers of 1000: `256M` is 244.14
/// MiB, where Slurm's `gpumem:256M` is 256 MiB).
pub const SIZES: &str = "SIZE: bytes, decimal units k/M/G/T (powers of 1000: 256M is 244.14 MiB, \
    unlike Slurm's gpumem:256M, which is 256 MiB), binary units KiB/MiB/GiB/TiB (powers of 1024), \
    decimals (1.5GiB) or 50% of the device's memory; a list gives each device its own: \
    0=8GiB,1=50%.";

/// The variables as `--help` ends: one line each.
pub fn variables_help() -> String {
    let mut out =
        String::from("Variables (read when the library loads; see also `man cudapool`):\n");
    for (name, values, what) in VARIABLES {
        out.push_str(&format!("  {name}={values}\n      {what}\n"));
    }
    out.push('\n');
    out.push_str(SIZES);
    out
}

/// Writes the man pages and the completions of `cmd` under `dir` (see the module doc).
pub fn generate(cmd: clap::Command, dir: &Path) -> Result<(), String> {
    let io = |what: &Path, e: std::io::Error| format!("{}: {e}", what.display());
    let man = dir.join("share/man/man1");
    std::fs::create_dir_all(&man).map_err(|e| io(&man, e))?;
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        page(
            sub.clone(),
            &format!("cudapool-{}", sub.get_name()),
            &man,
            false,
        )?;
    }
    page(cmd.clone(), "cudapool", &man, true)?;
    use clap_complete::Shell;
    // The completions offer the pool kinds where a pool is asked (the commands take them
    // through their own parser, for its messages, which completions cannot see).
    let kinds = |a: clap::Arg| a.value_parser(["split", "binned", "simple", "none"]);
    let mut cmd = cmd
        .mut_subcommand("run", |s| s.mut_arg("pool", kinds))
        .mut_subcommand("replay", |s| {
            s.mut_arg("pool", |a| a.value_parser(["split", "binned", "simple"]))
        });
    cmd.build();
    for (shell, sub, file) in [
        (Shell::Bash, "share/bash-completion/completions", "cudapool"),
        (Shell::Zsh, "share/zsh/site-functions", "_cudapool"),
        (
            Shell::Fish,
            "share/fish/vendor_completions.d",
            "cudapool.fish",
        ),
    ] {
        let folder = dir.join(sub);
        std::fs::create_dir_all(&folder).map_err(|e| io(&folder, e))?;
        let mut text = Vec::new();
        clap_complete::generate(shell, &mut cmd.clone(), "cudapool", &mut text);
        let path = folder.join(file);
        std::fs::write(&path, text).map_err(|e| io(&path, e))?;
    }
    Ok(())
}

/// One man page, named `name`; the main one ends with the variables.
fn page(cmd: clap::Command, name: &str, dir: &Path, main: bool) -> Result<(), String> {
    let path = dir.join(format!("{name}.1"));
    // clap names commands with static strings; this runs once, for a handful of pages.
    let cmd = cmd.name(&*Box::leak(name.to_string().into_boxed_str()));
    let man = clap_mangen::Man::new(cmd.clone())
        .title(name.to_uppercase())
        .source(format!("cudapool {}", env!("CARGO_PKG_VERSION")))
        .manual("cudapool");
    let mut text = Vec::new();
    let write = |text: &mut Vec<u8>| -> std::io::Result<()> {
        man.render_title(text)?;
        man.render_name_section(text)?;
        man.render_synopsis_section(text)?;
        man.render_description_section(text)?;
        if cmd.get_arguments().any(|a| !a.is_hide_set()) {
            man.render_options_section(text)?;
        }
        if cmd.has_subcommands() {
            man.render_subcommands_section(text)?;
        }
        if main {
            writeln!(text, ".SH ENVIRONMENT")?;
            for (var, values, what) in VARIABLES {
                writeln!(text, ".TP\n\\fB{var}\\fR={}\n{}", roff(values), roff(what))?;
            }
            writeln!(text, ".SH SIZES\n{}", roff(SIZES))?;
            // Every subcommand's page (issue 75, item 10: sleep and wake were missing).
            let pages: Vec<String> = (cmd.get_subcommands())
                .filter(|s| !s.is_hide_set() && s.get_name() != "help")
                .map(|s| format!("cudapool-{}(1)", s.get_name()))
                .collect();
            writeln!(text, ".SH SEE ALSO\n{}", roff(&pages.join(", ")))?;
        } else {
            writeln!(text, ".SH SEE ALSO\ncudapool(1)")?;
        }
        if cmd.get_version().is_some() {
            man.render_version_section(text)?;
        }
        Ok(())
    };
    write(&mut text).map_err(|e| format!("{name}: {e}"))?;
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// `s` safe in a roff text line: backslashes doubled, a leading dot or quote escaped.
fn roff(s: &str) -> String {
    let s = s.replace('\\', "\\\\").replace('-', "\\-");
    match s.chars().next() {
        Some('.') | Some('\'') => format!("\\&{s}"),
        _ => s,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_variable_the_library_knows_is_in_the_manual() {
        let known = cudapool::base::config::names::KNOWN;
        for name in known {
            assert!(
                super::VARIABLES.iter().any(|v| v.0 == *name),
                "{name} is not in the manual"
            );
        }
        for (name, ..) in super::VARIABLES {
            assert!(known.contains(name), "{name} is not known to the library");
        }
    }
}
