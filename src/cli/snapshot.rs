//! `cudapool snapshot PID [-o FILE] [--format json|torch]`: a running cudapool process of this
//! user writes its snapshot, without being stopped and without a signal. The request goes
//! through the process's live page (`cudapool::report::publish::ask_snapshot`); the process's
//! snapshot thread writes a new file beside FILE (never through a link, never a FIFO), which is
//! then renamed over FILE once FILE is checked as every output file is (`outfile`).

use cudapool::report::asks::ask_snapshot;
use cudapool::report::pages::exists;
use std::path::PathBuf;
use std::time::Duration;

/// How long to wait for the process's answer (it looks every 50 ms).
const WAIT: Duration = Duration::from_secs(10);

pub fn snapshot(pid: u32, out: Option<PathBuf>, torch: bool) -> Result<(), String> {
    if out.as_deref() == Some(std::path::Path::new("-")) {
        return to_stdout(pid, torch);
    }
    let ext = if torch { "pickle" } else { "json" };
    if let Some(name) = out
        .as_ref()
        .and_then(|p| p.extension())
        .and_then(|e| e.to_str())
    {
        // Written as asked, and said (issue 75, item 13: a pickle named .json, silently).
        if (torch && name.eq_ignore_ascii_case("json")) || (!torch && name == "pickle") {
            eprintln!(
                "cudapool snapshot: note: the file is {} though its name ends in .{name}",
                if torch {
                    "PyTorch's pickle"
                } else {
                    "cudapool's JSON"
                }
            );
        }
    }
    let target = out.unwrap_or_else(|| PathBuf::from(format!("cudapool-{pid}.{ext}")));
    let target = std::path::absolute(&target).map_err(|e| format!("{}: {e}", target.display()))?;
    let configured = super::stat::runtime_dir()?;
    if !exists(pid, configured.as_deref()) {
        return Err(super::absent::no_process(pid, false));
    }
    // The process creates this file new; it becomes FILE once complete.
    let part = target.with_file_name(format!(
        "{}.part-{}",
        target
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("snapshot"),
        std::process::id()
    ));
    // The target is checked now (its folder, and nothing but a file of ours at its name), and
    // again when the finished file is renamed over it.
    cudapool::base::outfile::check(&target)?;
    ask_snapshot(pid, configured.as_deref(), &part, torch, WAIT)
        .map_err(|e| format!("process {pid}: {e}"))?;
    let bytes = std::fs::metadata(&part)
        .map_err(|e| {
            format!(
                "process {pid} answered but wrote nothing to {}: {e}",
                part.display()
            )
        })?
        .len();
    if let Err(e) = cudapool::base::outfile::replace(&part, &target) {
        let _ = std::fs::remove_file(&part);
        return Err(e);
    }
    super::out::outln(&format!(
        "{} ({bytes} bytes, {} format)",
        target.display(),
        if torch { "torch" } else { "json" }
    ));
    Ok(())
}

/// `-o -`: the snapshot on standard output. The process writes it into a folder of this user's
/// own (made 0700, removed after), from where it is copied out.
fn to_stdout(pid: u32, torch: bool) -> Result<(), String> {
    use std::io::Write as _;
    let configured = super::stat::runtime_dir()?;
    if !exists(pid, configured.as_deref()) {
        return Err(super::absent::no_process(pid, false));
    }
    let mut template = std::env::temp_dir()
        .join("cudapool-snapshot-XXXXXX")
        .into_os_string()
        .into_encoded_bytes();
    template.push(0);
    // SAFETY: a NUL-terminated template mkdtemp fills in place.
    let made = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
    if made.is_null() {
        return Err(format!(
            "no private folder for it in {}: {}",
            std::env::temp_dir().display(),
            std::io::Error::last_os_error()
        ));
    }
    template.pop();
    let dir = PathBuf::from(std::ffi::OsString::from(
        String::from_utf8_lossy(&template).into_owned(),
    ));
    let part = dir.join("snapshot");
    let got = ask_snapshot(pid, configured.as_deref(), &part, torch, WAIT)
        .map_err(|e| format!("process {pid}: {e}"))
        .and_then(|()| {
            std::fs::read(&part)
                .map_err(|e| format!("process {pid} answered but wrote nothing: {e}"))
        });
    let _ = std::fs::remove_file(&part);
    let _ = std::fs::remove_dir(&dir);
    let bytes = got?;
    std::io::stdout()
        .write_all(&bytes)
        .map_err(|e| format!("standard output: {e}"))
}
