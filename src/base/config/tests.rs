use super::*;

#[test]
fn group_names_are_safe_file_names() {
    for good in ["job", "a.b_c-9", &"x".repeat(64)] {
        assert_eq!(parse_group(good).as_deref(), Ok(good));
    }
    for bad in [
        "",
        "a/b",
        "..",
        ".",
        "a b",
        "naïve",
        &"x".repeat(65),
        "../etc",
    ] {
        assert!(parse_group(bad).is_err(), "{bad:?} accepted");
    }
    let e = Config::from_lookup(|n| (n == "CUDAPOOL_GROUP").then(|| "a/b".to_string()));
    assert_eq!(e.unwrap_err().var, "CUDAPOOL_GROUP");
    let c = Config::from_lookup(|n| match n {
        "CUDAPOOL_GROUP" => Some("job-1".to_string()),
        "CUDAPOOL_GROUP_LIMIT" => Some("0=1GiB,1=50%".to_string()),
        _ => None,
    })
    .unwrap();
    assert_eq!(c.group.as_deref(), Some("job-1"));
    assert!(c.group_limit.is_set());
}

#[test]
fn faults_name_a_call_and_which_of_its_calls_fail() {
    let f = parse_faults("cuMemAlloc_v2@3, cuEventRecord@2-5=700,cuEventQuery@4+").unwrap();
    assert_eq!(
        f,
        vec![
            Fault {
                call: "cuMemAlloc_v2".into(),
                from: 3,
                to: 3,
                code: 2
            },
            Fault {
                call: "cuEventRecord".into(),
                from: 2,
                to: 5,
                code: 700
            },
            Fault {
                call: "cuEventQuery".into(),
                from: 4,
                to: u64::MAX,
                code: 999
            },
        ]
    );
    for bad in [
        "",
        "cuMemAlloc_v2",
        "cuMemAlloc_v2@0",
        "cuMemAlloc_v2@5-2",
        "cuMemAlloc_v2@x",
        "malloc@1",
        "cuMem Alloc@1",
        "cuMemAlloc_v2@1=oom",
    ] {
        assert!(parse_faults(bad).is_err(), "{bad:?} accepted");
    }
    let c = Config::from_lookup(|n| (n == "CUDAPOOL_FAULTS").then(|| "cuFoo@1".to_string()));
    assert_eq!(
        c.unwrap().faults.len(),
        1,
        "names are checked by the driver's table"
    );
    let e = Config::from_lookup(|n| (n == "CUDAPOOL_FAULTS").then(|| "@1".to_string()));
    assert_eq!(e.unwrap_err().var, "CUDAPOOL_FAULTS");
}
use std::collections::HashMap;

fn cfg(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let m: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_lookup(|k| m.get(k).cloned())
}

#[test]
fn sizes_in_every_form() {
    assert_eq!(parse_size("1073741824"), Ok(1 << 30));
    assert_eq!(parse_size("1k"), Ok(1000));
    assert_eq!(parse_size("1K"), Ok(1000));
    assert_eq!(parse_size("2KB"), Ok(2000));
    assert_eq!(parse_size("3M"), Ok(3_000_000));
    assert_eq!(parse_size("3mb"), Ok(3_000_000));
    assert_eq!(parse_size("4G"), Ok(4_000_000_000));
    assert_eq!(parse_size("4GB"), Ok(4_000_000_000));
    assert_eq!(parse_size("1T"), Ok(1_000_000_000_000));
    assert_eq!(parse_size("1TB"), Ok(1_000_000_000_000));
    assert_eq!(parse_size("1KiB"), Ok(1024));
    assert_eq!(parse_size("64MiB"), Ok(64 << 20));
    assert_eq!(parse_size("64mib"), Ok(64 << 20));
    assert_eq!(parse_size("1GiB"), Ok(1 << 30));
    assert_eq!(parse_size("1TiB"), Ok(1 << 40));
    assert_eq!(parse_size("1.5GiB"), Ok(1_610_612_736));
    assert_eq!(parse_size("0.5 KiB"), Ok(512));
    assert_eq!(parse_size(" 512 MB "), Ok(512_000_000));
    assert_eq!(parse_size("1.1"), Ok(1));
    assert_eq!(parse_size(".5k"), Ok(500));
}

#[test]
fn bad_sizes_are_refused() {
    for bad in [
        "",
        "GiB",
        "-1",
        "1.2.3",
        "1 PiB",
        "1e9",
        "abc",
        "1GiBs",
        "99999999999999999999999",
        "20000000TiB",
        "1,5G",
    ] {
        assert!(parse_size(bad).is_err(), "{bad:?} should be refused");
    }
}

#[test]
fn percentages_and_lists() {
    assert_eq!(parse_limit("50%"), Ok(Limit::Percent(50.0)));
    assert_eq!(parse_limit("12.5 %"), Ok(Limit::Percent(12.5)));
    assert!(parse_limit("0%").is_err());
    assert!(parse_limit("101%").is_err());
    assert!(parse_limit("x%").is_err());
    assert_eq!(Limit::Percent(50.0).resolve(1000), 500);
    assert_eq!(Limit::Bytes(7).resolve(1000), 7);

    let l = parse_device_limits("0=8GiB, 1=50%").unwrap();
    assert_eq!(l.for_device(0), Some(Limit::Bytes(8 << 30)));
    assert_eq!(l.for_device(1), Some(Limit::Percent(50.0)));
    assert_eq!(l.for_device(2), None);
    let all = parse_device_limits("1GiB").unwrap();
    assert_eq!(all.for_device(5), Some(Limit::Bytes(1 << 30)));
    for bad in ["0=1G,0=2G", "a=1G", "0=", "0=1G,1G", "-1=1G", "0=1G,,1=2G"] {
        assert!(
            parse_device_limits(bad).is_err(),
            "{bad:?} should be refused"
        );
    }
}

#[test]
fn environment_defaults_and_values() {
    assert_eq!(cfg(&[]).unwrap(), Config::default());
    let c = cfg(&[
        ("CUDAPOOL_POOL", "Binned"),
        ("CUDAPOOL_MEMORY_LIMIT", "0=1GiB"),
        ("CUDAPOOL_SOFT_LIMIT", "512MiB"),
        ("CUDAPOOL_REUSE", "immediate"),
        ("CUDAPOOL_REPORT", "stderr"),
        ("CUDAPOOL_TRACK", "2"),
        ("CUDAPOOL_TRACE", "/tmp/t.json"),
        ("CUDAPOOL_LOG", "debug"),
        ("CUDAPOOL_DISABLE", "0"),
        ("CUDAPOOL_SEGMENTS", "Expandable"),
        ("CUDAPOOL_STITCH", "Always"),
    ])
    .unwrap();
    assert_eq!(c.segments, Segments::Expandable);
    assert_eq!(c.stitch, Stitch::Always);
    assert_eq!(Config::default().stitch, Stitch::NearLimit);
    assert_eq!(
        cfg(&[("CUDAPOOL_STITCH", "near_limit")]).unwrap().stitch,
        Stitch::NearLimit
    );
    assert_eq!(c.pool, PoolKind::Binned);
    assert_eq!(c.memory_limit.for_device(0), Some(Limit::Bytes(1 << 30)));
    assert_eq!(c.memory_limit.for_device(1), None);
    assert_eq!(c.soft_limit.for_device(3), Some(Limit::Bytes(512 << 20)));
    assert_eq!(c.reuse, Reuse::Immediate);
    assert_eq!(c.report, Some(ReportTarget::Stderr));
    assert_eq!(c.track, 2);
    assert_eq!(c.trace, Some(PathBuf::from("/tmp/t.json")));
    assert_eq!(c.log, LogLevel::Debug);
    assert!(!c.disable);
    assert_eq!(
        cfg(&[("CUDAPOOL_REPORT", "/tmp/r.txt")]).unwrap().report,
        Some(ReportTarget::File("/tmp/r.txt".into()))
    );
    // Switch words are switches, not file names (issue 75, item 5).
    for on in ["1", "yes", "true", "on", "stderr"] {
        let r = cfg(&[("CUDAPOOL_REPORT", on)]).unwrap().report;
        assert_eq!(r, Some(ReportTarget::Stderr), "{on}");
    }
    for off in ["0", "no", "false", "off"] {
        assert_eq!(
            cfg(&[("CUDAPOOL_REPORT", off)]).unwrap().report,
            None,
            "{off}"
        );
    }
    let e = cfg(&[("CUDAPOOL_DISABLE", "maybe")])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("true, yes or on") && e.contains("false, no or off"),
        "{e}"
    );
    // An empty value is the same as unset.
    assert_eq!(
        cfg(&[("CUDAPOOL_MEMORY_LIMIT", " ")]).unwrap(),
        Config::default()
    );
}

#[test]
fn a_bad_value_names_variable_value_and_forms() {
    let e = cfg(&[("CUDAPOOL_MEMORY_LIMIT", "8GB5")]).unwrap_err();
    assert_eq!(e.var, "CUDAPOOL_MEMORY_LIMIT");
    let line = e.to_string();
    assert!(line.contains("CUDAPOOL_MEMORY_LIMIT=\"8GB5\""), "{line}");
    assert!(line.contains("GiB") && line.contains("50%"), "{line}");
    for (var, val) in [
        ("CUDAPOOL_POOL", "fast"),
        ("CUDAPOOL_SOFT_LIMIT", "lots"),
        ("CUDAPOOL_REUSE", "never"),
        ("CUDAPOOL_TRACK", "3"),
        ("CUDAPOOL_HISTORY", "-5"),
        ("CUDAPOOL_HISTORY", "20000000"),
        ("CUDAPOOL_LOG", "loud"),
        ("CUDAPOOL_DISABLE", "maybe"),
        ("CUDAPOOL_SEGMENTS", "elastic"),
        ("CUDAPOOL_STITCH", "sometimes"),
    ] {
        let e = cfg(&[(var, val)]).unwrap_err();
        assert_eq!(e.var, var);
        assert_eq!(e.value, val);
    }
}

#[test]
fn paths_are_made_absolute_and_checked_when_read() {
    let c = cfg(&[("CUDAPOOL_TRACE", "t.json")]).unwrap();
    let want = std::env::current_dir().unwrap().join("t.json");
    assert_eq!(c.trace, Some(want));
    let dir = std::env::temp_dir();
    let ok = dir.join(format!("cudapool-notes-{}", std::process::id()));
    let c = cfg(&[
        ("CUDAPOOL_REPORT", ok.to_str().unwrap()),
        ("CUDAPOOL_TRACE", "/no/such/folder/t.json"),
        ("CUDAPOOL_OOM_SNAPSHOT", "/no/such/folder/oom-%p-%n.pickle"),
    ])
    .unwrap();
    let notes = c.notes();
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(
        notes[0].starts_with("CUDAPOOL_TRACE: cannot be written: /no/such/folder: no such folder"),
        "{notes:?}"
    );
    assert!(notes[1].starts_with("CUDAPOOL_OOM_SNAPSHOT"), "{notes:?}");
}

#[test]
fn a_soft_limit_not_below_the_hard_one_is_said() {
    let notes = |pairs: &[(&str, &str)]| cfg(pairs).unwrap().notes();
    assert!(notes(&[
        ("CUDAPOOL_SOFT_LIMIT", "1GiB"),
        ("CUDAPOOL_MEMORY_LIMIT", "2GiB")
    ])
    .is_empty());
    let n = notes(&[
        ("CUDAPOOL_SOFT_LIMIT", "4GiB"),
        ("CUDAPOOL_MEMORY_LIMIT", "2GiB"),
    ]);
    assert_eq!(n.len(), 1, "{n:?}");
    assert!(n[0].contains("every device"), "{n:?}");
    let n = notes(&[
        ("CUDAPOOL_SOFT_LIMIT", "1=90%"),
        ("CUDAPOOL_MEMORY_LIMIT", "50%"),
    ]);
    assert_eq!(n.len(), 1, "{n:?}");
    assert!(n[0].contains("device 1"), "{n:?}");
    // Bytes against a percentage: the device's size is not known here; nothing said.
    assert!(notes(&[
        ("CUDAPOOL_SOFT_LIMIT", "4GiB"),
        ("CUDAPOOL_MEMORY_LIMIT", "50%")
    ])
    .is_empty());
}

#[test]
fn the_snapshot_count_kept() {
    assert_eq!(cfg(&[]).unwrap().oom_snapshot_keep, 16);
    assert_eq!(
        cfg(&[("CUDAPOOL_OOM_SNAPSHOT_KEEP", "3")])
            .unwrap()
            .oom_snapshot_keep,
        3
    );
    for bad in ["0", "-1", "x", "100001"] {
        assert!(
            cfg(&[("CUDAPOOL_OOM_SNAPSHOT_KEEP", bad)]).is_err(),
            "{bad}"
        );
    }
}

/// Issue 75, item 9: settings that apply only beside another were ignored without a word.
#[test]
fn a_setting_that_needs_another_is_said_when_alone() {
    let notes = |pairs: &[(&str, &str)]| cfg(pairs).unwrap().notes();
    let n = notes(&[
        ("CUDAPOOL_GROUP_LIMIT", "2GiB"),
        ("CUDAPOOL_SLEEP_IDLE", "30s"),
    ]);
    assert_eq!(
        n,
        vec!["CUDAPOOL_GROUP_LIMIT, CUDAPOOL_SLEEP_IDLE: apply only in a group, and CUDAPOOL_GROUP is not set: ignored"]
    );
    assert!(notes(&[
        ("CUDAPOOL_GROUP", "g"),
        ("CUDAPOOL_GROUP_LIMIT", "2GiB"),
        ("CUDAPOOL_MEMORY_REQUEST", "1GiB"),
    ])
    .is_empty());
    let n = notes(&[("CUDAPOOL_OOM_SNAPSHOT_KEEP", "3")]);
    assert_eq!(n.len(), 1, "{n:?}");
    assert!(
        n[0].starts_with("CUDAPOOL_OOM_SNAPSHOT_KEEP: applies only with"),
        "{n:?}"
    );
}

/// `CUDAPOOL_SUSPEND`'s default: a Slurm job's process sleeps when it is stopped (its group
/// `slurm-<id>`, or the mandatory mode's job); a member of a user's own group does not, so that
/// a Ctrl-Z of one member holds the others' work only when asked; the variable decides.
#[test]
fn a_slurm_jobs_process_sleeps_when_stopped_by_default_and_no_other() {
    let with = |group: Option<&str>, job: Option<&str>, set: Option<bool>| {
        let mut c = Config {
            group: group.map(str::to_string),
            job: job.map(str::to_string),
            ..Config::default()
        };
        c.sleep.suspend = set;
        c.suspend_sleeps()
    };
    assert!(with(Some("slurm-42"), None, None));
    assert!(with(Some("team"), Some("42"), None));
    assert!(!with(Some("team"), None, None));
    assert!(!with(Some("slurm-"), None, None));
    assert!(!with(Some("slurm-x1"), None, None));
    assert!(!with(None, None, None));
    assert!(with(None, None, Some(true)));
    assert!(!with(Some("slurm-42"), None, Some(false)));
}
