//! What the tests of the whole library under `LD_PRELOAD` share: the fake `libcuda.so.1` and
//! the C clients, built once per test binary (in its own folder), and how they are run and
//! read. Each test binary uses its part of it.
#![allow(dead_code)]

pub mod members;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

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
        let capture = src("tests/c/capture.c");
        let sleep = src("tests/c/sleep.c");
        let mut a = strict.to_vec();
        a.extend([
            &inc, "-o", "client", &client, &reuse, &lifetimes, &capture, &sleep,
        ]);
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
            &capture,
            &sleep,
        ]);
        a.extend(["-L.", "-lcuda", "-ldl", "-lpthread"]);
        cc(&a, &dir);
        let holes = src("tests/c/holes.c");
        let mut a = strict.to_vec();
        let include = format!("-I{}", src("include"));
        a.extend([&include, "-o", "holes", &holes, "-ldl", "-lpthread"]);
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

/// The cache's mechanics (reuse, fences, lending, sleep) are tested with freed memory kept
/// until pressure: every client runs under `CUDAPOOL_CACHE_IDLE=never` unless its test sets
/// the variable (the tests of giving back do) or the runner's `CPTEST_CACHE_IDLE` names
/// another value.
pub fn cache_idle(cmd: &mut Command) {
    let idle = std::env::var("CPTEST_CACHE_IDLE").unwrap_or_else(|_| "never".into());
    cmd.env("CUDAPOOL_CACHE_IDLE", idle);
}

/// Runs `program args` with the fake driver on the library path, the shim preloaded when
/// `shim` is set, and `env` on top of a clean `CUDAPOOL_*` environment (but for the
/// `CUDAPOOL_SEGMENTS` the runner's `CPTEST_SEGMENTS` names, and [`cache_idle`]).
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
    if let Ok(mode) = std::env::var("CPTEST_SEGMENTS") {
        cmd.env("CUDAPOOL_SEGMENTS", mode);
    }
    cache_idle(&mut cmd);
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

// ---- programs that must end: the chaos and hostile-neighbour suites ----

pub fn uid() -> u32 {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() }
}

/// A `chaos` client under the shim with a clean `CUDAPOOL_*` environment plus `env`.
pub fn chaos(args: &[&str], env: &[(&str, &str)]) -> Command {
    let f = fixture();
    let mut cmd = Command::new(f.dir.join("chaos"));
    cmd.args(args).current_dir(&f.dir);
    for (k, _) in std::env::vars() {
        if k.starts_with("CUDAPOOL_") || k.starts_with("FAKECU_") {
            cmd.env_remove(k);
        }
    }
    cache_idle(&mut cmd);
    cmd.env("LD_LIBRARY_PATH", &f.dir)
        .env("LD_PRELOAD", &f.lib)
        .envs(env.iter().copied());
    cmd
}

pub struct Out {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` to its end, at most `limit` (then kills it and fails: a hang). What it wrote is
/// read until its pipes close, or for 10 s more at most (something it left running in the
/// background may hold them).
pub fn finish(mut cmd: Command, limit: Duration, what: &str) -> Out {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let read = |mut pipe: Box<dyn std::io::Read + Send>| {
        let (tx, rx) = std::sync::mpsc::channel();
        let text = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let t2 = text.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                t2.lock().unwrap().extend_from_slice(&buf[..n]);
            }
            let _ = tx.send(());
        });
        (rx, text)
    };
    let o = read(Box::new(child.stdout.take().unwrap()));
    let e = read(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let _ = o.0.recv_timeout(Duration::from_secs(1));
            let _ = e.0.recv_timeout(Duration::from_secs(1));
            panic!(
                "{what}: hung (no end within {} s)\nstdout:\n{}\nstderr:\n{}",
                limit.as_secs(),
                String::from_utf8_lossy(&o.1.lock().unwrap()),
                String::from_utf8_lossy(&e.1.lock().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = o.0.recv_timeout(Duration::from_secs(10));
    let _ = e.0.recv_timeout(Duration::from_secs(10));
    let text = |t: &std::sync::Arc<std::sync::Mutex<Vec<u8>>>| {
        String::from_utf8_lossy(&t.lock().unwrap()).into_owned()
    };
    Out {
        status,
        stdout: text(&o.1),
        stderr: text(&e.1),
    }
}

/// The environment of the suites' `sh` scripts, in the fake driver's folder: no `CUDAPOOL_*`
/// of the runner's, the fake driver on the library path, `SHIM` (the library), `CHAOS` (the
/// chaos client) and `CLI` (the command).
pub fn script_env(cmd: &mut Command) -> &mut Command {
    let f = fixture();
    cmd.current_dir(&f.dir);
    for (k, _) in std::env::vars() {
        if k.starts_with("CUDAPOOL_") || k.starts_with("FAKECU_") {
            cmd.env_remove(k);
        }
    }
    cache_idle(cmd);
    cmd.env_remove("LD_PRELOAD")
        .env("LD_LIBRARY_PATH", &f.dir)
        .env("SHIM", &f.lib)
        .env("CHAOS", f.dir.join("chaos"))
        .env("CLI", env!("CARGO_BIN_EXE_cudapool"))
}

/// Runs `script` (sh) in a private mount namespace with its own tmpfs at `/dev/shm` of `size`
/// (as root; else in a user namespace, where the kernel allows it). `None` if neither works.
pub fn in_small_shm(size: &str, script: &str, env: &[(&str, &str)]) -> Option<Out> {
    let mount = format!("mount -t tmpfs -o size={size} tmpfs /dev/shm || exit 97; {script}");
    let mut cmd = Command::new("unshare");
    if uid() != 0 {
        cmd.arg("-r");
    }
    cmd.args(["-m", "sh", "-c", &mount]);
    script_env(&mut cmd).envs(env.iter().copied());
    let o = finish(cmd, Duration::from_secs(120), script);
    if o.status.code() == Some(97) || (o.status.code() == Some(1) && o.stderr.contains("unshare")) {
        eprintln!(
            "no private mount namespace here ({}): not checked",
            o.stderr.trim()
        );
        return None;
    }
    Some(o)
}

/// A cudapool process that holds 1 MiB until its stdin closes (`chaos once hold`), with `env`,
/// started and seen to hold it, its live page given time to appear.
pub fn start_holder(env: &[(&str, &str)]) -> std::process::Child {
    let mut holder = chaos(&["once", "hold"], env);
    holder.stdin(Stdio::piped()).stdout(Stdio::piped());
    let mut child = holder.spawn().unwrap();
    let mut line = String::new();
    use std::io::BufRead as _;
    std::io::BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("once ok"), "{line}");
    std::thread::sleep(Duration::from_millis(300));
    child
}

/// A TCP port on 127.0.0.1 that nothing listens on now (the kernel's choice, given back at
/// once): a fixed or pid-derived port can fall in the ephemeral range, where any outgoing
/// connection of the machine may hold it.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A new folder `PREFIX` + six random characters, made by `mkdtemp` (so no one could plant it
/// beforehand), that everyone may read and only its owner write (0755).
pub fn open_temp_dir(prefix: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let mut template = format!("{prefix}XXXXXX\0").into_bytes();
    // SAFETY: mkdtemp rewrites the X's of our NUL-terminated buffer in place.
    let made = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
    assert!(
        !made.is_null(),
        "mkdtemp: {}",
        std::io::Error::last_os_error()
    );
    let dir = PathBuf::from(std::str::from_utf8(&template[..template.len() - 1]).unwrap());
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// What another uid must run or read, staged where it can reach it: a new folder under
/// `/var/tmp` (made by `mkdtemp`, so no one could plant it beforehand; mode 0755, root's to
/// write) holding the fixture's programs and fake driver, the library as `libcudapool.so` and the
/// command as `cudapool`, each a hard link (a copy across file systems). A checkout in a folder
/// only its owner may enter (`mkdir -m 700`, root's home) is out of another uid's reach, so
/// every cross-user test runs what it hands to another uid from here. Removed on drop.
pub struct Staged {
    pub dir: PathBuf,
}

impl Staged {
    pub fn new() -> Staged {
        let staged = Staged {
            dir: open_temp_dir("/var/tmp/cudapool-stage-"),
        };
        let f = fixture();
        let place = |from: &Path, name: &std::ffi::OsStr| {
            let to = staged.dir.join(name);
            if std::fs::hard_link(from, &to).is_err() {
                std::fs::copy(from, &to).unwrap();
            }
        };
        for e in std::fs::read_dir(&f.dir).unwrap().flatten() {
            let (path, kind) = (e.path(), e.file_type().unwrap());
            if kind.is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                std::os::unix::fs::symlink(target, staged.dir.join(e.file_name())).unwrap();
            } else if kind.is_file() {
                place(&path, &e.file_name());
            }
        }
        place(&f.lib, "libcudapool.so".as_ref());
        place(
            Path::new(env!("CARGO_BIN_EXE_cudapool")),
            "cudapool".as_ref(),
        );
        staged
    }

    /// Points `cmd` (made by [`script_env`]) at the staged copies: its folder, `SHIM`, `CHAOS`,
    /// `CLI` and the library path.
    pub fn apply<'a>(&self, cmd: &'a mut Command) -> &'a mut Command {
        cmd.current_dir(&self.dir)
            .env("LD_LIBRARY_PATH", &self.dir)
            .env("SHIM", self.dir.join("libcudapool.so"))
            .env("CHAOS", self.dir.join("chaos"))
            .env("CLI", self.dir.join("cudapool"))
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The number a script printed as `KEY=N` (a word of its output `all`); panics with the whole
/// output when there is none.
pub fn figure(all: &str, key: &str) -> u64 {
    all.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {key}: {all}"))
}
