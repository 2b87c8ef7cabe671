//! What the tests of the whole library under `LD_PRELOAD` share: the fake `libcuda.so.1` and
//! the C clients, built once per test binary (in its own folder), and how they are run and
//! read. Each test binary uses its part of it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub const MIB: u64 = 1 << 20;
/// The fake driver's memory per device (its default).
pub const FAKE_TOTAL: u64 = 1 << 30;
pub const DL_MODES: [&str; 3] = ["dlsym", "gpa", "gpa-ptsz"];
/// Every pool kind; the ones that cache.
pub const POOLS: [&str; 4] = ["none", "split", "binned", "simple"];
pub const CACHING: [&str; 3] = ["split", "binned", "simple"];

pub struct Fixture {
    pub dir: PathBuf,
    pub lib: PathBuf,
}

pub fn cc(args: &[&str], cwd: &Path) {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
    assert!(
        out.status.success(),
        "{cc} {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds the fake driver and the clients once per test binary.
pub fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        // A folder per test binary: the binaries run at the same time.
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(env!("CARGO_CRATE_NAME"));
        std::fs::create_dir_all(&dir).unwrap();
        let src = |p: &str| root.join(p).to_string_lossy().into_owned();
        let inc = format!("-I{}", src("tests/c"));
        let strict = ["-Wall", "-Wextra", "-Werror", "-O1"];
        let mut a = strict.to_vec();
        let fake = src("tests/fake/libcuda.c");
        // -Bsymbolic: like the real driver, the fake's references to its own functions bind
        // inside it, so its cuGetProcAddress answers with its own pointers, never with a
        // preloaded library's same-named symbol.
        a.extend([
            "-shared",
            "-fPIC",
            "-Wl,-Bsymbolic",
            "-o",
            "libcuda.so.1",
            &fake,
        ]);
        a.push("-lpthread");
        cc(&a, &dir);
        let _ = std::fs::remove_file(dir.join("libcuda.so"));
        std::os::unix::fs::symlink("libcuda.so.1", dir.join("libcuda.so")).unwrap();
        let client = src("tests/c/client.c");
        let reuse = src("tests/c/reuse.c");
        let lifetimes = src("tests/c/lifetimes.c");
        let mut a = strict.to_vec();
        a.extend([&inc, "-o", "client", &client, &reuse, &lifetimes]);
        a.extend(["-ldl", "-lpthread"]);
        cc(&a, &dir);
        let mut a = strict.to_vec();
        a.extend([
            &inc,
            "-DLINKED",
            "-o",
            "client_linked",
            &client,
            &reuse,
            &lifetimes,
        ]);
        a.extend(["-L.", "-lcuda", "-ldl", "-lpthread"]);
        cc(&a, &dir);
        let memapi = src("tests/c/memapi.c");
        let mut a = strict.to_vec();
        a.extend(["-o", "memapi", &memapi, "-ldl"]);
        cc(&a, &dir);
        // The fake NVML and a program that reads it, looked up and linked.
        let fake_nvml = src("tests/fake/libnvidia-ml.c");
        let mut a = strict.to_vec();
        a.extend(["-shared", "-fPIC", "-o", "libnvidia-ml.so.1", &fake_nvml]);
        cc(&a, &dir);
        let _ = std::fs::remove_file(dir.join("libnvidia-ml.so"));
        std::os::unix::fs::symlink("libnvidia-ml.so.1", dir.join("libnvidia-ml.so")).unwrap();
        let nvml = src("tests/c/nvml.c");
        let mut a = strict.to_vec();
        a.extend(["-o", "nvml", &nvml, "-ldl"]);
        cc(&a, &dir);
        let mut a = strict.to_vec();
        a.extend([
            "-DLINKED",
            "-o",
            "nvml_linked",
            &nvml,
            "-L.",
            "-lnvidia-ml",
            "-ldl",
        ]);
        cc(&a, &dir);
        let chaos = src("tests/c/chaos.c");
        let mut a = strict.to_vec();
        a.extend([&inc, "-o", "chaos", &chaos, "-ldl", "-lpthread"]);
        cc(&a, &dir);
        let ranges = src("tests/c/ranges.c");
        let mut a = strict.to_vec();
        a.extend(["-o", "ranges", &ranges, "-ldl"]);
        cc(&a, &dir);
        // The fake NVTX tool reads NVIDIA's NVTX headers (vendored) for its types.
        let tool = src("tests/fake/nvtx_tool.c");
        let nvtx_inc = format!("-I{}", src("third_party"));
        let mut a = strict.to_vec();
        a.extend([
            "-shared",
            "-fPIC",
            &nvtx_inc,
            "-o",
            "libfakenvtx.so",
            &tool,
            "-lpthread",
        ]);
        cc(&a, &dir);
        let nvtx = src("tests/c/nvtx.c");
        let mut a = strict.to_vec();
        a.extend(["-o", "nvtx", &nvtx, "-ldl"]);
        cc(&a, &dir);
        let wrap = src("tests/c/next_wrap.c");
        let mut a = strict.to_vec();
        a.extend(["-shared", "-fPIC", "-o", "libnext_wrap.so", &wrap, "-ldl"]);
        cc(&a, &dir);
        let main = src("tests/c/next_main.c");
        let mut a = strict.to_vec();
        a.extend(["-o", "next_main", &main]);
        cc(&a, &dir);

        // The cdylib cargo built beside the CLI binary.
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_cudapool"));
        let libdir = bin.parent().unwrap();
        let lib = libdir.join("libcudapool.so");
        assert!(
            lib.is_file(),
            "{} missing: run `cargo build` first (scripts/test.sh does)",
            lib.display()
        );
        // The header, strictly, linked against the library (-lcudapool), and the C example.
        let header = format!("-I{}", src("include"));
        let check = src("tests/c/header_check.c");
        let libdir_flag = format!("-L{}", libdir.display());
        let mut a = strict.to_vec();
        a.extend([
            &header,
            "-o",
            "header_check",
            &check,
            &libdir_flag,
            "-lcudapool",
        ]);
        cc(&a, &dir);
        let example = src("cbindings/c/print_status.c");
        let mut a = strict.to_vec();
        a.extend([&header, "-o", "print_status", &example, "-ldl"]);
        cc(&a, &dir);
        Fixture { dir, lib }
    })
}

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// The `key=value` pairs of the first stdout line starting with `tag ` (or `tag=`).
    pub fn line(&self, tag: &str) -> HashMap<String, String> {
        let line = self
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("{tag} ")) || l.starts_with(&format!("{tag}=")))
            .unwrap_or_else(|| panic!("no line {tag:?} in:\n{}\n{}", self.stdout, self.stderr));
        line.split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    pub fn get(&self, tag: &str, key: &str) -> String {
        self.line(tag)
            .get(key)
            .cloned()
            .unwrap_or_else(|| panic!("no {key} on line {tag}:\n{}", self.stdout))
    }

    pub fn num(&self, tag: &str, key: &str) -> u64 {
        self.get(tag, key).parse().unwrap()
    }
}

/// Runs `program args` with the fake driver on the library path, the shim preloaded when
/// `shim` is set, and `env` on top of a clean `CUDAPOOL_*` environment (but for the
/// `CUDAPOOL_SEGMENTS` the runner's `CUDAPOOL_TEST_SEGMENTS` names).
pub fn run_program(program: &Path, args: &[&str], shim: bool, env: &[(&str, &str)]) -> Run {
    let f = fixture();
    let mut cmd = Command::new(program);
    cmd.args(args).current_dir(&f.dir);
    for (k, _) in std::env::vars() {
        if k.starts_with("CUDAPOOL_") || k.starts_with("FAKECU_") || k == "CLIENT_DEVICE" {
            cmd.env_remove(k);
        }
    }
    // The whole suite runs again with classic segments (scripts/test.sh): every client
    // gets the mode the runner names, unless its test sets one.
    if let Ok(mode) = std::env::var("CUDAPOOL_TEST_SEGMENTS") {
        cmd.env("CUDAPOOL_SEGMENTS", mode);
    }
    cmd.env("LD_LIBRARY_PATH", &f.dir);
    if shim {
        cmd.env("LD_PRELOAD", &f.lib);
    } else {
        cmd.env_remove("LD_PRELOAD");
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().expect("run");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

pub fn client(mode: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let f = fixture();
    let bin = if mode == "link" {
        "client_linked"
    } else {
        "client"
    };
    let mut all = vec![mode];
    all.extend_from_slice(args);
    run_program(&f.dir.join(bin), &all, true, env)
}

pub fn ok(r: Run) -> Run {
    assert_eq!(r.code, 0, "client failed:\n{}\n{}", r.stdout, r.stderr);
    r
}

pub fn all_modes() -> impl Iterator<Item = &'static str> {
    std::iter::once("link").chain(DL_MODES)
}

/// A virtual environment with `tests/python/requirements.txt`, made once (again when the
/// requirements change). Its python.
pub fn test_venv() -> PathBuf {
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

/// As many open descriptors as the hard limit allows (tests that hold a thousand).
pub fn raise_open_files() {
    // SAFETY: a zeroed rlimit is valid; getrlimit fills it, setrlimit reads it.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}
