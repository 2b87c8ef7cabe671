//! A Slurm job's GPU memory in Slurm's own accounting (issue 51): what the root Epilog records
//! of the job on its node (`record`, from the job's group ledger), and `cudapool jobstat JOBID`,
//! which prints it for a person, from `sacct` once the job ended or from the live ledger while
//! it runs.
//!
//! **Where.** The job's `AdminComment` (only Slurm's administrators may write it; `sacct -o
//! AdminComment` shows it beside `ReqTRES`): a compact JSON object whose `cudapool` key holds
//! one entry per node, `{"<node>": {"share": B, "gpus": [{"uuid", "limit", "peak_reserved",
//! "refused", "members"}]}}`. Whatever else the comment held is kept: another node's entry, the
//! site's own JSON keys, or the site's plain text (kept under `"text"`). It is read from the
//! accounting (`sacct -o AdminComment`: a field only administrators write, never `scontrol show
//! job`'s text, where a user's comment could pose as it) and written with `scontrol update`,
//! run directly, never through a shell: by `sacctmgr modify job` (the job has ended when the
//! Epilog runs, and slurmctld no longer updates it), which stores each `"` as a backtick: a
//! reader turns them back (`decode`; `tr '`' '"'`): ours never holds a `'` or backtick of its
//! own (`encode` writes them as `\u0027` and `\u0060`), so a site's text comes back exactly. Two nodes' Epilogs that run at the same instant can
//! still each write over the other's entry (Slurm has no append): said in docs/deploying.md.
//!
//! **What the figures are.** The group's record in its ledger, which is the job's user's to
//! write: informative, not evidence against the user. Peak allocated is not recorded (it lives
//! in each process); the peak is of what the group's members held from the driver together.

use cudapool::base::job::{ledger_dir, read_share, JOBS_DIR};
use cudapool::base::rundir::of_job;
use cudapool::limits::group::ledger;
use cudapool::report::fmt_bytes;
use cudapool::report::page::fmt_uuid;
use serde_json::{json, Map, Value};
use std::path::Path;

/// A job id as Slurm gives it: digits only (an array task's own id too), at most 20.
pub fn job_id(s: &str) -> Result<&str, String> {
    if !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit()) {
        Ok(s)
    } else {
        Err(format!("{s:?} is not a job id"))
    }
}

/// A node name as Slurm's `SLURMD_NODENAME` gives it: letters, digits, `.`, `_`, `-`.
fn node_name(s: &str) -> Option<&str> {
    (!s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-'))
    .then_some(s)
}

/// This node's entry for job `job`, from its group ledger in the job's folder of root; `None`
/// when the job had no group here (no gpumem, or no CUDA process ran).
pub fn node_entry(job: &str) -> Option<Value> {
    let dir_path = ledger_dir(job);
    let fname = ledger::file_name(&format!("slurm-{job}"));
    let owner = std::fs::symlink_metadata(dir_path.join(&fname)).ok()?;
    let dir = of_job(&dir_path, std::os::unix::fs::MetadataExt::uid(&owner)).ok()?;
    let view = ledger::read(&dir, &fname).ok()?;
    let share = read_share(Path::new(JOBS_DIR), job)
        .ok()
        .flatten()
        .and_then(|s| s.limit.all)
        .map(|l| l.resolve(0));
    let gpus: Vec<Value> = view
        .devices
        .iter()
        .zip(&view.record)
        .map(|((uuid, limit, _), (peak, refused, members))| {
            json!({
                // Lower case: the accounting stores it so.
                "uuid": fmt_uuid(uuid).to_ascii_lowercase(),
                "limit": limit,
                "peak_reserved": peak,
                "refused": refused,
                "members": members,
            })
        })
        .collect();
    let s = view.suspends;
    let mut entry = json!({ "share": share, "gpus": gpus });
    if s.sleeps > 0 {
        // Slurm suspended the job: its members' sleeps, the bytes they gave back, those that
        // ended after Slurm's 2 s (the job held GPU memory while stopped), and the seconds
        // they stayed asleep, all together.
        entry["suspends"] = json!({
            "sleeps": s.sleeps,
            "bytes": s.bytes,
            "late": s.late,
            "seconds": (s.asleep_ms / 100) as f64 / 10.0,
        });
    }
    Some(entry)
}

/// Why `sacct` gave no answer, in one line that says what is missing (its own messages are
/// Slurm's internals: `resolve_ctls_from_dns_srv ... fatal: ...`).
fn sacct_failed(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let has = |w: &str| text.contains(w);
    if has("Could not establish a configuration source")
        || has("Unable to process configuration file")
    {
        "Slurm is not set up on this machine (sacct found no slurm.conf and no slurmctld to ask): run this on a node of the cluster".into()
    } else if has("Connection refused") || has("database") || has("slurmdbd") {
        "Slurm's accounting (slurmdbd) does not answer: jobstat reads finished jobs from it (docs/deploying.md)".into()
    } else {
        // Something else: sacct's last line, which says most.
        let last = text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no message");
        format!("sacct failed: {}", last.trim())
    }
}

/// The job's `AdminComment` as Slurm's accounting holds it (empty when none): one field of
/// `sacct`, which only Slurm's administrators write, never a text the user wrote.
///
/// `None` while the accounting has no whole record of the job yet (slurmctld sends it
/// asynchronously: a job that ended a moment ago may not be there, or lack its request). The
/// job is matched by its raw id: sacct names an array's task `11_0`, never by the id its
/// Epilog has.
fn admin_comment(job: &str) -> Result<Option<String>, String> {
    let out = super::slurm_site::slurm_command("sacct")?
        .args([
            "--noheader",
            "--parsable2",
            "--allocations",
            "--format=JobIDRaw,ReqTRES,AdminComment",
        ])
        .arg(format!("--jobs={job}"))
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run sacct: {e}"))?;
    if !out.status.success() {
        return Err(sacct_failed(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{job}|")))
        .and_then(|rest| rest.split_once('|'))
        .filter(|(req, _)| !req.is_empty())
        .map(|(_, comment)| comment.to_string()))
}

/// The comment as JSON for `sacctmgr`, which stores every `"` and `'` as a backtick: its own
/// `'` and backticks (only ever inside strings: a site's text) go as `\u0027` and `\u0060`, so
/// that turning the backticks back into `"` ([`decode`]) gives this JSON again, exactly.
pub fn encode(v: &Value) -> String {
    v.to_string()
        .replace('\'', "\\u0027")
        .replace('`', "\\u0060")
}

/// A comment as the accounting holds it: JSON as a site set it (with `scontrol`, verbatim), our
/// JSON as `sacctmgr` stored it (its `"` as backticks), or a site's plain text, kept verbatim
/// under `"text"`.
pub fn decode(stored: &str) -> Map<String, Value> {
    let stored = stored.trim();
    let object = |t: &str| match serde_json::from_str::<Value>(t) {
        Ok(Value::Object(m)) => Some(m),
        _ => None,
    };
    if stored.is_empty() {
        return Map::new();
    }
    object(stored)
        .or_else(|| object(&stored.replace('`', "\"")))
        .unwrap_or_else(|| {
            let mut m = Map::new();
            m.insert("text".into(), Value::String(stored.to_string()));
            m
        })
}

/// `existing` (the comment as it is) with this node's `entry` put under `cudapool.<node>`,
/// everything else kept.
fn merged(existing: &str, node: &str, entry: Value) -> Value {
    let mut top = decode(existing);
    let nodes = top
        .entry("cudapool")
        .or_insert_with(|| Value::Object(Map::new()));
    if !nodes.is_object() {
        *nodes = Value::Object(Map::new());
    }
    nodes
        .as_object_mut()
        .expect("an object")
        .insert(node.to_string(), entry);
    Value::Object(top)
}

/// How long the Epilog waits for the job's record to reach the accounting: an Epilog holds the
/// node, so it gives up (one line) well within Slurm's patience.
const RECORD_WAIT: std::time::Duration = std::time::Duration::from_secs(4);

/// Records this node's `entry` for job `job` (read with [`node_entry`] before the job's files
/// were removed) into its `AdminComment` (the root Epilog).
pub fn record(job: &str, entry: Value) -> Result<(), String> {
    let node = std::env::var("SLURMD_NODENAME")
        .ok()
        .and_then(|n| node_name(&n).map(str::to_string))
        .ok_or("SLURMD_NODENAME is not a node name")?;
    // Changed only once the accounting holds the job's own record: a change made before it
    // arrives would stand in for it (seen: the job's user and request lost).
    let deadline = std::time::Instant::now() + RECORD_WAIT;
    let existing = loop {
        if let Some(c) = admin_comment(job)? {
            break c;
        }
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "the accounting has no record of the job after {} s",
                RECORD_WAIT.as_secs()
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let text = encode(&merged(&existing, &node, entry));
    // The job has ended when the Epilog runs: slurmctld refuses to update it ("Job has already
    // finished"); its record in the accounting is what `sacct` shows, changed by sacctmgr.
    let out = super::slurm_site::slurm_command("sacctmgr")?
        .args(["--immediate", "modify", "job", "where"])
        .arg(format!("jobid={job}"))
        .arg("set")
        .arg(format!("AdminComment={text}"))
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run sacctmgr: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "sacctmgr modify job where jobid={job} set AdminComment=... failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// A job as `jobstat` takes it: a job id, or an array task as sacct names it (`11_0`).
fn job_or_task(s: &str) -> Result<&str, String> {
    let ok = match s.split_once('_') {
        Some((a, t)) => {
            job_id(a).is_ok()
                && !t.is_empty()
                && t.len() <= 10
                && t.bytes().all(|b| b.is_ascii_digit())
        }
        None => job_id(s).is_ok(),
    };
    ok.then_some(s).ok_or(format!(
        "{s:?} is not a job id (12345, or an array task: 12345_7)"
    ))
}

/// `cudapool jobstat JOBID`: what the job asked for and used, per node and GPU. An array job's
/// id lists each of its tasks (`11_0`, `11_1`...); a task's own id (`11_0`) that one.
pub fn jobstat(job: &str) -> Result<(), String> {
    let job = job_or_task(job)?;
    // Running on this node: its live ledger.
    if let Some(entry) = job_id(job).ok().and_then(node_entry) {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        print(job, "running", &json!({ host.trim(): entry }));
        return Ok(());
    }
    let out = super::slurm_site::slurm_command("sacct")?
        .args(["--noheader", "--parsable2", "--allocations"])
        .arg(format!("--jobs={job}"))
        .args(["--format=JobID,JobIDRaw,State,ReqTRES,AdminComment"])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run sacct (Slurm's accounting): {e}"))?;
    if !out.status.success() {
        return Err(sacct_failed(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // The job itself (by its id, or its raw id), or each task of the array it names.
    let rows: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.splitn(5, '|').collect::<Vec<_>>())
        .filter(|f| f.len() == 5)
        .filter(|f| {
            f[0] == job || f[1] == job || f[0].split_once('_').is_some_and(|(a, _)| a == job)
        })
        .collect();
    if rows.is_empty() {
        return Err(format!("Slurm's accounting knows no job {job}"));
    }
    for f in rows {
        let (id, state, req, comment) = (f[0], f[2], f[3], f[4]);
        println!("job {id}: {state}, asked {req}");
        let nodes = decode(comment)
            .get("cudapool")
            .cloned()
            .filter(Value::is_object);
        match nodes {
            Some(n) => print(id, "", &n),
            None => {
                println!("  no GPU memory recorded (no gpumem group ran, or no Epilog recorded it)")
            }
        }
    }
    Ok(())
}

fn print(job: &str, state: &str, nodes: &Value) {
    if !state.is_empty() {
        println!("job {job}: {state}");
    }
    let Some(nodes) = nodes.as_object() else {
        return;
    };
    for (node, e) in nodes {
        let share = e["share"]
            .as_u64()
            .map_or("none".to_string(), |b| format!("{} per GPU", fmt_bytes(b)));
        println!("  node {node}: share {share}");
        for g in e["gpus"].as_array().into_iter().flatten() {
            let n = |k: &str| g[k].as_u64().unwrap_or(0);
            println!(
                "    {}: peak {} of {} (limit {}), {} refused, {} {}",
                g["uuid"].as_str().unwrap_or("?"),
                fmt_bytes(n("peak_reserved")),
                share,
                match n("limit") {
                    0 => "none".to_string(),
                    l => fmt_bytes(l),
                },
                n("refused"),
                n("members"),
                if n("members") == 1 {
                    "process"
                } else {
                    "processes"
                }
            );
        }
        let s = &e["suspends"];
        if let Some(sleeps) = s["sleeps"].as_u64() {
            let late = s["late"].as_u64().unwrap_or(0);
            let asleep = match s["seconds"].as_f64() {
                Some(secs) => format!(", asleep {secs:.1} s in all"),
                None => String::new(),
            };
            println!(
                "    suspended: {sleeps} {} gave {} back{asleep}{}",
                if sleeps == 1 { "sleep" } else { "sleeps" },
                fmt_bytes(s["bytes"].as_u64().unwrap_or(0)),
                if late > 0 {
                    format!(", {late} after Slurm's 2 s (the GPU held it until then)")
                } else {
                    String::new()
                }
            );
        }
        let c = &e["checkpoints"];
        if let Some(count) = c["count"].as_u64() {
            println!(
                "    checkpointed by the driver for other jobs: {count} {} (not put to sleep when asked), {} moved, {} s held",
                if count == 1 { "time" } else { "times" },
                fmt_bytes(c["bytes"].as_u64().unwrap_or(0)),
                c["seconds"].as_u64().unwrap_or(0)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sacct_failing_is_said_in_one_line() {
        let no_conf = b"sacct: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n\
            sacct: error: fetch_config: DNS SRV lookup failed\n\
            sacct: fatal: Could not establish a configuration source\n";
        let e = sacct_failed(no_conf);
        assert!(e.starts_with("Slurm is not set up on this machine"), "{e}");
        assert!(!e.contains('\n') && !e.contains("resolve_ctls"), "{e}");
        let dbd = b"sacct: error: slurm_persist_conn_open_without_init: failed to open persistent connection to host:localhost:6819: Connection refused\n";
        assert!(sacct_failed(dbd).contains("(slurmdbd) does not answer"));
        assert_eq!(sacct_failed(b"x\ny\n"), "sacct failed: y");
    }

    /// Issue 60, item 6: a site's note with quotes, apostrophes, backticks and JSON of its own,
    /// through two Epilogs' records, stored as sacctmgr stores (every `"` and `'` a backtick),
    /// comes back exactly [`it's` came back as `it"s`, backticks as quotes].
    #[test]
    fn a_sites_note_survives_every_record_exactly() {
        let sacctmgr = |s: &str| s.replace(['"', '\''], "`");
        let note = r#"ops: it's "checked" `x` {"site":1}"#;
        let first = sacctmgr(&encode(&merged(note, "n1", json!({"share": 1}))));
        let second = sacctmgr(&encode(&merged(&first, "n2", json!({"share": 2}))));
        let back = decode(&second);
        assert_eq!(back["text"], note, "{second}");
        assert_eq!(back["cudapool"]["n1"]["share"], 1);
        assert_eq!(back["cudapool"]["n2"]["share"], 2);
        // A site's own JSON, set with scontrol (verbatim), is merged into, not kept as text.
        let own = decode(r#"{"ops": "it's fine"}"#);
        assert_eq!(own["ops"], "it's fine");
    }

    #[test]
    fn a_nodes_entry_keeps_what_the_comment_held() {
        let e = json!({"share": 1});
        let m = merged("", "n1", e.clone());
        assert_eq!(m, json!({"cudapool": {"n1": {"share": 1}}}));
        let m2 = merged(&m.to_string(), "n2", json!({"share": 2}));
        assert_eq!(
            m2["cudapool"]["n1"]["share"], 1,
            "the other node's entry kept"
        );
        assert_eq!(m2["cudapool"]["n2"]["share"], 2);
        let site = merged(r#"{"site": "x"}"#, "n1", e.clone());
        assert_eq!(site["site"], "x");
        let text = merged("checked by ops", "n1", e);
        assert_eq!(text["text"], "checked by ops", "the site's text kept");
        assert!(node_name("gpu-01.cluster").is_some());
        assert!(node_name("n1;id").is_none());
    }
}
