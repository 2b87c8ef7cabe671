//! The `cudapool` command: `run`, `stat`, `top`, `plot`, `snapshot`, `sleep`, `wake`, `exporter`,
//! `config`, `slurm`, `jobstat` and `replay`, parsed by clap (the preloaded library links none of it). Every subcommand answers
//! `--help` (and `cudapool help SUB`); a usage error names the subcommand and the option and
//! exits 2; `run` exits 126 or 127 when the program cannot be started; output into a closed
//! pipe ends quietly with status 0 (`cli::out`).

mod cli {
    pub mod absent;
    pub mod arbiter;
    pub mod checkpoint;
    pub mod checkpointed;
    pub mod config;
    pub mod exporter;
    pub mod jobstat;
    pub mod keys;
    pub mod manual;
    pub mod metrics;
    pub mod out;
    pub mod plot;
    pub mod replay;
    pub mod run;
    pub mod sleep;
    pub mod slurm;
    pub mod slurm_site;
    pub mod snapshot;
    pub mod stat;
}

use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

/// Routes every CUDA allocation of a program through a caching pool with a hard limit per GPU,
/// and shows where the memory went.
#[derive(Parser)]
#[command(
    name = "cudapool",
    version,
    disable_help_subcommand = false,
    after_help = "Variables (CUDAPOOL_MEMORY_LIMIT, CUDAPOOL_POOL, CUDAPOOL_GROUP, ...): `cudapool --help` lists them all, `man cudapool` too.\n\
                  Run `cudapool help SUBCOMMAND` or `cudapool SUBCOMMAND --help` for each one.",
    after_long_help = cli::manual::variables_help() + "\n\nRun `cudapool help SUBCOMMAND` or `cudapool SUBCOMMAND --help` for each one."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a program with libcudapool.so preloaded
    #[command(
        after_help = "Other CUDAPOOL_* variables in the environment are passed on, each checked first \
                      with the library's own parser (a bad one exits 2 before anything runs).\n\
                      Example: cudapool run --limit 8GiB --report -- python train.py"
    )]
    Run(RunArgs),
    /// The live figures of running cudapool processes of this user
    #[command(
        after_help = "Examples: cudapool stat        (every process of yours)\n          \
                            cudapool stat -v 4242   (one, and the folders read)"
    )]
    Stat(StatArgs),
    /// `stat` again and again, refreshed like top
    #[command(after_help = "Example: cudapool top -d 0.5 4242   (q quits; ends when 4242 does)")]
    Top(TopArgs),
    /// Draw allocated, reserved and limit over time from a CUDAPOOL_TRACE file, as SVG
    #[command(
        after_help = "Example: CUDAPOOL_TRACE=trace.json cudapool run -- python train.py\n         \
                            cudapool plot trace.json -o memory.svg"
    )]
    Plot(PlotArgs),
    /// Have a running cudapool process of this user write its snapshot, without stopping it
    #[command(
        after_help = "Example: cudapool snapshot 4242 --format torch -o step.pickle   \
                            (open it at pytorch.org/memory_viz)"
    )]
    Snapshot(SnapshotArgs),
    /// Put running cudapool processes to sleep: their device memory to the host, addresses kept
    #[command(
        after_help = "Live blocks of expandable segments are copied to host memory, cached ones dropped and \
                      the device memory given back; the process's next launch, copy or allocation wakes it \
                      first. Classic segments stay. Your own processes; root's any.\n\
                      Example: cudapool sleep --wait 4242"
    )]
    Sleep(SleepArgs),
    /// Wake sleeping cudapool processes: their memory back at the same addresses
    #[command(after_help = "Example: cudapool wake --wait 4242")]
    Wake(WakeArgs),
    /// Serve Prometheus /metrics for every cudapool process of this user (of every user as root)
    #[command(after_help = "Example: cudapool exporter --listen :9489   \
                            (then: curl -s localhost:9489/metrics)")]
    Exporter(ExporterArgs),
    /// Flags to compile and link C or C++ against cudapool (like pkg-config)
    #[command(after_help = "Example: cc prog.c $(cudapool config --cflags --libs) -lcuda")]
    Config(cli::config::ConfigArgs),
    /// Slurm's Prolog, Epilog and TaskProlog for cudapool (deploy/slurm/ hands over to these)
    #[command(
        after_help = "slurmd runs these for each job (slurm.conf: Prolog=, Epilog=, TaskProlog= \
                            naming deploy/slurm/'s scripts). By hand: cudapool slurm share 1234 --gpus 0,1 \
                            (what job 1234 may hold on each of its GPUs here)"
    )]
    Slurm(cli::slurm::SlurmArgs),
    /// A Slurm job's GPU memory: asked, peak, refusals, per node and GPU
    #[command(after_help = "Example: cudapool jobstat 1234   (an array task: 1234_7)")]
    Jobstat(JobstatArgs),
    /// Replay allocation traces through the pool kinds (no GPU): peak reserved against allocated
    #[command(
        after_help = "FILE: a plain trace (`a ID SIZE`, `f ID`, `#` comments), a PyTorch memory snapshot \
                      with history (torch.cuda.memory._dump_snapshot), or a CUDAPOOL_TRACE file written \
                      with CUDAPOOL_HISTORY=N.\n\
                      Example: cudapool replay --pool split --segments expandable snapshot.pickle"
    )]
    Replay(ReplayArgs),
}

#[derive(Args)]
struct ReplayArgs {
    /// Traces to replay
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Only this pool kind: split, binned or simple (default: each)
    #[arg(long, value_name = "KIND", allow_hyphen_values = true)]
    pool: Option<String>,
    /// Only these segments: classic or expandable (default: both for split)
    #[arg(long, value_name = "S", value_parser = ["classic", "expandable"], allow_hyphen_values = true)]
    segments: Option<String>,
    /// Replay under this hard limit (e.g. 8GiB), as CUDAPOOL_MEMORY_LIMIT would set
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    limit: Option<String>,
    /// When expandable segments stitch, as CUDAPOOL_STITCH: near-limit (default) or always
    /// (their rows then read `stitching`)
    #[arg(long, value_name = "RULE", value_parser = ["near-limit", "always"], allow_hyphen_values = true)]
    stitch: Option<String>,
    /// One JSON object per line, per file and configuration
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct JobstatArgs {
    /// The job's id
    job: String,
}

#[derive(Args)]
struct RunArgs {
    /// Hard limit per device (CUDAPOOL_MEMORY_LIMIT): 8GiB, 1.5G, 50%, or a per-device list
    /// 0=8GiB,1=50%; 0 means no limit. M and G are decimal (256M is 244.14 MiB; Slurm's
    /// gpumem:256M is 256 MiB): write MiB and GiB for binary
    #[arg(long, value_name = "SIZE", value_parser = cli::run::parse_limit_arg, allow_hyphen_values = true)]
    limit: Option<String>,
    /// Pool kind (CUDAPOOL_POOL): split, binned, simple or none
    #[arg(long, value_name = "KIND", value_parser = cli::run::parse_pool_arg, allow_hyphen_values = true)]
    pool: Option<String>,
    /// Print the memory status at exit (CUDAPOOL_REPORT=stderr)
    #[arg(long)]
    report: bool,
    /// The program and its arguments (after `--`, or the first word that is not an option)
    #[arg(required = true, trailing_var_arg = true, value_name = "PROGRAM")]
    program: Vec<OsString>,
}

#[derive(Args)]
struct StatArgs {
    /// Also say which files were skipped, and why
    #[arg(short, long)]
    verbose: bool,
    /// Each GPU's whole UUID (the short form otherwise)
    #[arg(short, long)]
    wide: bool,
    /// Only these processes
    #[arg(value_parser = pid)]
    pids: Vec<u32>,
}

#[derive(Args)]
struct TopArgs {
    /// Also say which files were skipped, and why
    #[arg(short, long)]
    verbose: bool,
    /// Each GPU's whole UUID (the short form otherwise)
    #[arg(short, long)]
    wide: bool,
    /// Stop after COUNT screens
    #[arg(short = 'n', long, value_name = "COUNT", default_value_t = u64::MAX, hide_default_value = true, value_parser = count, allow_hyphen_values = true)]
    count: u64,
    /// Seconds between screens
    #[arg(short = 'd', long, value_name = "SECONDS", default_value_t = 1.0, value_parser = positive_seconds, allow_hyphen_values = true)]
    delay: f64,
    /// Only these processes
    #[arg(value_parser = pid)]
    pids: Vec<u32>,
}

#[derive(Args)]
struct PlotArgs {
    /// A trace written under CUDAPOOL_TRACE
    trace: PathBuf,
    /// The picture to write (.svg)
    #[arg(
        short,
        long,
        value_name = "FILE",
        default_value = "memory.svg",
        allow_hyphen_values = true
    )]
    output: PathBuf,
}

#[derive(Args)]
struct SnapshotArgs {
    /// The process (as `cudapool stat` lists it)
    #[arg(value_parser = pid)]
    pid: u32,
    /// Where to write it (default cudapool-PID.json or .pickle)
    #[arg(short, long, value_name = "FILE", allow_hyphen_values = true)]
    output: Option<PathBuf>,
    /// cudapool's JSON, or PyTorch's pickle for pytorch.org/memory_viz
    #[arg(long, value_name = "FORMAT", default_value = "json", value_parser = ["json", "torch"], allow_hyphen_values = true)]
    format: String,
}

#[derive(Args)]
struct SleepArgs {
    /// The processes (as `cudapool stat` lists them)
    #[arg(value_parser = pid)]
    pids: Vec<u32>,
    /// Every process of this group (CUDAPOOL_GROUP) too
    #[arg(long, value_name = "NAME", allow_hyphen_values = true)]
    group: Option<String>,
    /// Return when done, and print the bytes moved, the seconds and GB/s
    #[arg(long)]
    wait: bool,
    /// How long a sleep waits for the process's device work to drain (a graph capture under
    /// way postpones it): 500ms, 30s, 5m
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = duration, allow_hyphen_values = true)]
    timeout: std::time::Duration,
}

#[derive(Args)]
struct WakeArgs {
    /// The processes (as `cudapool stat` lists them)
    #[arg(value_parser = pid)]
    pids: Vec<u32>,
    /// Every process of this group (CUDAPOOL_GROUP) too
    #[arg(long, value_name = "NAME", allow_hyphen_values = true)]
    group: Option<String>,
    /// Return when done, and print the bytes moved, the seconds and GB/s (a wake waits for
    /// room up to the process's CUDAPOOL_WAKE_TIMEOUT)
    #[arg(long)]
    wait: bool,
}

/// A process id, as `cudapool stat` lists them.
fn pid(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(format!(
            "not a process id: {s:?} (a number, as `cudapool stat` lists them)"
        )),
    }
}

fn duration(s: &str) -> Result<std::time::Duration, String> {
    cudapool::base::config::parse_duration(s).map_err(|why| {
        format!(
            "{s:?}: {why}; accepted: {}",
            cudapool::base::config::DURATION_FORMS
        )
    })
}

#[derive(Args)]
struct ExporterArgs {
    /// Where to listen: :PORT (every interface), localhost:PORT, HOST:PORT, IPv4:PORT or
    /// [IPv6]:PORT (port 0: any free port)
    #[arg(long, value_name = "ADDR:PORT", default_value = cli::exporter::DEFAULT_LISTEN, value_parser = cli::exporter::parse_listen, allow_hyphen_values = true)]
    listen: cli::exporter::Listen,
    /// Read the processes' pages at most this often (0: every scrape)
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0, value_parser = seconds, allow_hyphen_values = true)]
    interval: f64,
}

const SUBCOMMANDS: [&str; 12] = [
    "run", "stat", "top", "plot", "snapshot", "sleep", "wake", "exporter", "config", "slurm",
    "jobstat", "replay",
];

fn seconds(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .ok_or(format!("{s:?} is not a number of seconds, 0 or more"))
}

fn count(s: &str) -> Result<u64, String> {
    s.parse::<u64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or(format!("{s:?} is not a count of screens, 1 or more"))
}

fn positive_seconds(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v > 0.0)
        .ok_or(format!("{s:?} is not a number of seconds more than 0"))
}

/// A subcommand's result: its error printed as `cudapool SUB: ...`, exit 2 (or its own code).
fn finish(sub: &str, r: Result<(), String>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cudapool {sub}: {e}");
            ExitCode::from(2)
        }
    }
}

fn main() -> ExitCode {
    // `cudapool manual DIR`: the man pages and shell completions written under DIR/share, for
    // packagers (the wheel's build, the test that keeps share/ current). Outside the command's
    // definition, so that neither its help, its pages nor its completions offer it.
    let args: Vec<OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "manual") {
        let [_, _, dir] = &args[..] else {
            eprintln!("usage: cudapool manual DIR");
            return ExitCode::from(2);
        };
        let cmd = <Cli as clap::CommandFactory>::command();
        return finish(
            "manual",
            cli::manual::generate(cmd, std::path::Path::new(dir)),
        );
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            // Bare `cudapool`: the help, as it is, on stderr (it is no answer to a question).
            eprint!("{}", e.render());
            return ExitCode::from(2);
        }
        Err(e) if !e.use_stderr() => {
            // Help and version, on stdout (a closed pipe there is no error).
            cli::out::out(&e.render().to_string());
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // A usage error, on stderr, naming the subcommand: "cudapool run: invalid value ...".
            let sub = std::env::args()
                .skip(1)
                .find(|a| !a.starts_with('-'))
                .filter(|a| SUBCOMMANDS.contains(&a.as_str()));
            let text = e.render().to_string();
            let text = text.strip_prefix("error: ").unwrap_or(&text);
            match sub {
                Some(sub) => eprint!("cudapool {sub}: {text}"),
                None => eprint!("cudapool: {text}"),
            }
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::Run(a) => cli::run::run(a.limit, a.pool, a.report, a.program),
        Command::Stat(a) => finish("stat", cli::stat::stat(&a.pids, a.verbose, a.wide)),
        Command::Top(a) => finish(
            "top",
            cli::stat::top(&a.pids, a.verbose, a.wide, a.count, a.delay),
        ),
        Command::Plot(a) => finish(
            "plot",
            cli::plot::plot(&a.trace.to_string_lossy(), &a.output.to_string_lossy()),
        ),
        Command::Snapshot(a) => finish(
            "snapshot",
            cli::snapshot::snapshot(a.pid, a.output, a.format == "torch"),
        ),
        Command::Sleep(a) => finish(
            "sleep",
            cli::sleep::sleep(&a.pids, a.group.as_deref(), false, a.wait, a.timeout),
        ),
        Command::Wake(a) => finish(
            "wake",
            cli::sleep::sleep(
                &a.pids,
                a.group.as_deref(),
                true,
                a.wait,
                std::time::Duration::from_secs(30),
            ),
        ),
        Command::Exporter(a) => {
            cli::exporter::exporter(a.listen, std::time::Duration::from_secs_f64(a.interval))
        }
        Command::Config(a) => finish("config", cli::config::config(&a)),
        Command::Slurm(a) => cli::slurm::slurm(a),
        Command::Jobstat(a) => finish("jobstat", cli::jobstat::jobstat(&a.job)),
        Command::Replay(a) => finish(
            "replay",
            cli::replay::replay(
                &a.files,
                a.pool.as_deref(),
                a.segments.as_deref(),
                a.limit.as_deref(),
                a.stitch.as_deref(),
                a.json,
            ),
        ),
    }
}
