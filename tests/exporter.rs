//! `cudapool exporter` (issue 24) over real HTTP, read by the Prometheus project's own parsers
//! (`prometheus_client`, installed at a pinned version into `target/test-venv`), with
//! fake-driver clients holding known amounts (`tests/python/check_exporter.py`). And the
//! preloaded library links none of the exporter's crates.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A virtual environment with `tests/python/requirements.txt`, made once (again when the
/// requirements change). Its python.
fn test_venv() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv = root.join("target/test-venv");
    let req = root.join("tests/python/requirements.txt");
    let stamp = venv.join("installed.txt");
    let python = venv.join("bin/python");
    if std::fs::read(&stamp).ok() != std::fs::read(&req).ok() {
        let _ = std::fs::remove_dir_all(&venv);
        let ok = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "python3 -m venv failed (python3 with venv is needed)");
        let out = Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "-r",
            ])
            .arg(&req)
            .output()
            .expect("pip");
        assert!(
            out.status.success(),
            "pip install -r {}:\n{}",
            req.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::copy(&req, &stamp).unwrap();
    }
    python
}

#[test]
fn the_exporter_serves_what_every_process_holds_to_prometheus_parsers() {
    let f = fixture();
    let python = test_venv();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/check_exporter.py");
    let out = Command::new(python)
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_cudapool"))
        .arg(f.dir.join("client"))
        .arg(&f.lib)
        .current_dir(&f.dir)
        .env("LD_LIBRARY_PATH", &f.dir)
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run check_exporter.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    assert!(
        out.status.success() && stdout.contains(" 0 failed"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_preloaded_library_links_none_of_the_exporters_crates() {
    let f = fixture();
    let lib = std::fs::read(&f.lib).unwrap();
    let cli = std::fs::read(env!("CARGO_BIN_EXE_cudapool")).unwrap();
    let has = |bytes: &[u8], what: &str| bytes.windows(what.len()).any(|w| w == what.as_bytes());
    for krate in [
        "/tokio-1.",
        "/hyper-1.",
        "/fastmetrics-0.",
        "/hyper-util-0.",
    ] {
        assert!(has(&cli, krate), "the check sees {krate} in the CLI");
        assert!(!has(&lib, krate), "libcudapool.so carries {krate}");
    }
}
