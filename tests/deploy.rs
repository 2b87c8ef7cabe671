//! The deployment files (docs/deploying.md; issue 47): the Kubernetes pod as far as a
//! machine without a cluster can check it (no pod was run: there is no cluster here), and the
//! files operators and checks rely on where docs/deploying.md says. The Slurm and Prometheus recipes run
//! for real in tests/slurm.rs and tests/prometheus.rs.

mod common;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The pod parses; one user, the memory-backed /dev/shm in every container, one group and
/// limit, settings `cudapool run` takes; and docs/deploying.md shows this very file.
#[test]
fn the_kubernetes_pod_is_the_one_the_docs_name_and_its_settings_hold() {
    let pod = root().join("deploy/kubernetes/pod.yaml");
    let r = run_program(
        &test_venv(),
        &[
            root().join("tests/python/check_pod.py").to_str().unwrap(),
            pod.to_str().unwrap(),
            env!("CARGO_BIN_EXE_cudapool"),
        ],
        false,
        &[],
    );
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("pod: ok [('inference', '20GiB')]"),
        "{}",
        r.stdout
    );
    let docs = std::fs::read_to_string(root().join("docs/deploying.md")).unwrap();
    let text = std::fs::read_to_string(&pod).unwrap();
    let body: String = text
        .lines()
        .skip_while(|l| l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(
        docs.contains(&format!("```yaml\n{body}```")),
        "docs/deploying.md shows deploy/kubernetes/pod.yaml as it is (its comment apart)"
    );
}

/// The paths docs/deploying.md names exist, the prologs are executable, and they parse as bash.
#[test]
fn the_deployment_files_are_where_the_spec_says() {
    for f in [
        "deploy/slurm/task_prolog.sh",
        "deploy/slurm/task_epilog.sh",
        "deploy/slurm/prolog.sh",
        "deploy/slurm/epilog.sh",
    ] {
        let p = root().join(f);
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert!(mode & 0o111 != 0, "{f} is executable");
        let r = run_program(Path::new("bash"), &["-n", p.to_str().unwrap()], false, &[]);
        assert_eq!(r.code, 0, "{f}: {}", r.stderr);
    }
    // What runs as root is the `cudapool` binary: the root scripts only hand over to it, and
    // nothing of them splits a text on words or hands one to a shell (issue 54, case 1).
    for f in ["deploy/slurm/prolog.sh", "deploy/slurm/epilog.sh"] {
        let text = std::fs::read_to_string(root().join(f)).unwrap();
        let code: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .collect();
        assert!(
            code.len() == 1 && code[0].starts_with("exec /usr/local/bin/cudapool slurm "),
            "{f} is one exec of the binary: {code:?}"
        );
    }
    assert!(!root().join("deploy/slurm/gpumem_share.sh").exists());
    for f in [
        "deploy/prometheus/rules.yml",
        "deploy/prometheus/rules_test.yml",
        "deploy/kubernetes/pod.yaml",
    ] {
        assert!(root().join(f).is_file(), "{f}");
    }
}
