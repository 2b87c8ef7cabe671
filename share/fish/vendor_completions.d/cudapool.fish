# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_cudapool_global_optspecs
    string join \n h/help V/version
end

function __fish_cudapool_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_cudapool_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_cudapool_using_subcommand
    set -l cmd (__fish_cudapool_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c cudapool -n "__fish_cudapool_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c cudapool -n "__fish_cudapool_needs_command" -s V -l version -d 'Print version'
complete -c cudapool -n "__fish_cudapool_needs_command" -f -a "stat" -d 'The live figures of running cudapool processes of this user'
complete -c cudapool -n "__fish_cudapool_needs_command" -f -a "top" -d '`stat` again and again, refreshed like top'
complete -c cudapool -n "__fish_cudapool_needs_command" -f -a "plot" -d 'Draw allocated, reserved and limit over time from a CUDAPOOL_TRACE file, as SVG'
complete -c cudapool -n "__fish_cudapool_needs_command" -f -a "snapshot" -d 'Have a running cudapool process of this user write its snapshot, without stopping it'
complete -c cudapool -n "__fish_cudapool_needs_command" -f -a "sleep" -d 'Put running cudapool processes to sleep: their device memory to the host, addresses kept'
complete -c cudapool -n "__fish_cudapool_needs_command" -f -a "wake" -d 'Wake sleeping cudapool processes: their memory back at the same addresses'
complete -c cudapool -n "__fish_cudapool_needs_command" -f -a "exporter" -d 'Serve Prometheus /metrics for every cudapool process of this user (of every user as root)'
complete -c cudapool -n "__fish_cudapool_needs_command" -f -a "config" -d 'Flags to compile and link C or C++ against cudapool (like pkg-config)'
complete -c cudapool -n "__fish_cudapool_needs_command" -f -a "slurm" -d 'Slurm\'s Prolog, Epilog and TaskProlog for cudapool (deploy/slurm/ hands over to these)'
complete -c cudapool -n "__fish_cudapool_needs_command" -f -a "jobstat" -d 'A Slurm job\'s GPU memory: asked, peak, refusals, per node and GPU'
complete -c cudapool -n "__fish_cudapool_needs_command" -f -a "run" -d 'Run a program with libcudapool.so preloaded'
complete -c cudapool -n "__fish_cudapool_needs_command" -f -a "replay" -d 'Replay allocation traces through the pool kinds (no GPU): peak reserved against allocated'
complete -c cudapool -n "__fish_cudapool_using_subcommand stat" -s v -l verbose -d 'Also say which files were skipped, and why'
complete -c cudapool -n "__fish_cudapool_using_subcommand stat" -s w -l wide -d 'Each GPU\'s whole UUID (the short form otherwise)'
complete -c cudapool -n "__fish_cudapool_using_subcommand stat" -s h -l help -d 'Print help'
complete -c cudapool -n "__fish_cudapool_using_subcommand top" -s n -l count -d 'Stop after COUNT screens' -r
complete -c cudapool -n "__fish_cudapool_using_subcommand top" -s d -l delay -d 'Seconds between screens' -r
complete -c cudapool -n "__fish_cudapool_using_subcommand top" -s v -l verbose -d 'Also say which files were skipped, and why'
complete -c cudapool -n "__fish_cudapool_using_subcommand top" -s w -l wide -d 'Each GPU\'s whole UUID (the short form otherwise)'
complete -c cudapool -n "__fish_cudapool_using_subcommand top" -s h -l help -d 'Print help'
complete -c cudapool -n "__fish_cudapool_using_subcommand plot" -s o -l output -d 'The picture to write (.svg)' -r -F
complete -c cudapool -n "__fish_cudapool_using_subcommand plot" -s h -l help -d 'Print help'
complete -c cudapool -n "__fish_cudapool_using_subcommand snapshot" -s o -l output -d 'Where to write it (default cudapool-PID.json or .pickle)' -r -F
complete -c cudapool -n "__fish_cudapool_using_subcommand snapshot" -l format -d 'cudapool\'s JSON, or PyTorch\'s pickle for pytorch.org/memory_viz' -r -f -a "json\t''
torch\t''"
complete -c cudapool -n "__fish_cudapool_using_subcommand snapshot" -s h -l help -d 'Print help'
complete -c cudapool -n "__fish_cudapool_using_subcommand sleep" -l group -d 'Every process of this group (CUDAPOOL_GROUP) too' -r
complete -c cudapool -n "__fish_cudapool_using_subcommand sleep" -l timeout -d 'How long a sleep waits for the process\'s device work to drain (a graph capture under way postpones it): 500ms, 30s, 5m' -r
complete -c cudapool -n "__fish_cudapool_using_subcommand sleep" -l wait -d 'Return when done, and print the bytes moved, the seconds and GB/s'
complete -c cudapool -n "__fish_cudapool_using_subcommand sleep" -s h -l help -d 'Print help'
complete -c cudapool -n "__fish_cudapool_using_subcommand wake" -l group -d 'Every process of this group (CUDAPOOL_GROUP) too' -r
complete -c cudapool -n "__fish_cudapool_using_subcommand wake" -l wait -d 'Return when done, and print the bytes moved, the seconds and GB/s (a wake waits for room up to the process\'s CUDAPOOL_WAKE_TIMEOUT)'
complete -c cudapool -n "__fish_cudapool_using_subcommand wake" -s h -l help -d 'Print help'
complete -c cudapool -n "__fish_cudapool_using_subcommand exporter" -l listen -d 'Where to listen: :PORT (every interface), localhost:PORT, HOST:PORT, IPv4:PORT or [IPv6]:PORT (port 0: any free port)' -r
complete -c cudapool -n "__fish_cudapool_using_subcommand exporter" -l interval -d 'Read the processes\' pages at most this often (0: every scrape)' -r
complete -c cudapool -n "__fish_cudapool_using_subcommand exporter" -s h -l help -d 'Print help'
complete -c cudapool -n "__fish_cudapool_using_subcommand config" -l cflags -d 'Compiler flags: -I the folder of cudapool.h'
complete -c cudapool -n "__fish_cudapool_using_subcommand config" -l libs -d 'Linker flags: -L, an rpath, and -lcudapool'
complete -c cudapool -n "__fish_cudapool_using_subcommand config" -l includedir -d 'The folder of cudapool.h'
complete -c cudapool -n "__fish_cudapool_using_subcommand config" -l libdir -d 'The folder of libcudapool.so'
complete -c cudapool -n "__fish_cudapool_using_subcommand config" -l pkgconfigdir -d 'The folder of cudapool.pc (for PKG_CONFIG_PATH)'
complete -c cudapool -n "__fish_cudapool_using_subcommand config" -l cmakedir -d 'The folder of cudapool-config.cmake (for cudapool_DIR or CMAKE_PREFIX_PATH)'
complete -c cudapool -n "__fish_cudapool_using_subcommand config" -s h -l help -d 'Print help'
complete -c cudapool -n "__fish_cudapool_using_subcommand slurm; and not __fish_seen_subcommand_from prolog epilog task-prolog arbiter checkpoint share" -l config -d 'The site\'s settings (default /etc/cudapool/slurm.conf, or CUDAPOOL_SLURM_CONFIG)' -r -F
complete -c cudapool -n "__fish_cudapool_using_subcommand slurm; and not __fish_seen_subcommand_from prolog epilog task-prolog arbiter checkpoint share" -s h -l help -d 'Print help'
complete -c cudapool -n "__fish_cudapool_using_subcommand slurm; and not __fish_seen_subcommand_from prolog epilog task-prolog arbiter checkpoint share" -f -a "prolog" -d 'Slurm\'s root Prolog: writes the job\'s share into /run/cudapool/jobs/JOBID (as root)'
complete -c cudapool -n "__fish_cudapool_using_subcommand slurm; and not __fish_seen_subcommand_from prolog epilog task-prolog arbiter checkpoint share" -f -a "epilog" -d 'Slurm\'s root Epilog: removes the job\'s share and its group\'s folder (as root)'
complete -c cudapool -n "__fish_cudapool_using_subcommand slurm; and not __fish_seen_subcommand_from prolog epilog task-prolog arbiter checkpoint share" -f -a "task-prolog" -d 'Slurm\'s TaskProlog: prints the exports that preload cudapool into the job\'s group'
complete -c cudapool -n "__fish_cudapool_using_subcommand slurm; and not __fish_seen_subcommand_from prolog epilog task-prolog arbiter checkpoint share" -f -a "arbiter" -d 'Root\'s arbiter on a node whose GPU memory is overcommitted (overcommit= in the site\'s settings): puts jobs above their request to sleep for others, idle ones first, busy ones for a job within its own request (as root, a service)'
complete -c cudapool -n "__fish_cudapool_using_subcommand slurm; and not __fish_seen_subcommand_from prolog epilog task-prolog arbiter checkpoint share" -f -a "checkpoint" -d 'Has the driver checkpoint a process, as the arbiter does for one that does not put itself to sleep: its CUDA calls wait, its device memory goes to its host memory; with --restore, brings it back and lets it run (as root; CUDA 12.8 or later drivers)'
complete -c cudapool -n "__fish_cudapool_using_subcommand slurm; and not __fish_seen_subcommand_from prolog epilog task-prolog arbiter checkpoint share" -f -a "share" -d 'Prints a job\'s share of GPU memory per GPU on this node, in bytes'
complete -c cudapool -n "__fish_cudapool_using_subcommand slurm; and __fish_seen_subcommand_from prolog" -l config -d 'The site\'s settings (default /etc/cudapool/slurm.conf, or CUDAPOOL_SLURM_CONFIG)' -r -F
complete -c cudapool -n "__fish_cudapool_using_subcommand slurm; and __fish_seen_subcommand_from prolog" -s h -l help -d 'Print help'
complete -c cudapool -n "__fish_cudapool_using_subcommand slurm; and __fish_seen_subcommand_from epilog" -l config -d 'The site\'s settings (default /etc/cudapool/slurm.conf, or CUDAPOOL_SLURM_CONFIG)' -r -F
complete -c cudapool -n "__fish_cudapool_using_subcommand slurm; and __fish_seen_subcommand_from epilog" -s h -l help -d 'Print help'
complete -c cudapool -n "__fish_cudapool_using_subcommand slurm; and __fish_seen_subcommand_from task-prolog" -l config -d 'The site\'s settings (default /etc/cudapool/slurm.conf, or CUDAPOOL_SLURM_CONFIG)' -r -F
complete -c cudapool -n "__fish_cudapool_using_subcommand slurm; and __fish_seen_subcommand_from task-prolog" -s h -l help -d 'Print help'
complete -c cudapool -n "__fish_cudapool_using_subcommand slurm; and __fish_seen_subcommand_from arbiter" -l config -d 'The site\'s settings (default /etc/cudapool/slurm.conf, or CUDAPOOL_SLURM_CONFIG)' -r -F
complete -c cudapool -n "__fish_cudapool_using_subcommand slurm; and __fish_seen_subcommand_from arbiter" -l once -d 'Serve one request, then end (tests)'
complete -c cudapool -n "__fish_cudapool_using_subcommand slurm; and __fish_seen_subcommand_from arbiter" -s h -l help -d 'Print help'
complete -c cudapool -n "__fish_cudapool_using_subcommand slurm; and __fish_seen_subcommand_from checkpoint" -l config -d 'The site\'s settings (default /etc/cudapool/slurm.conf, or CUDAPOOL_SLURM_CONFIG)' -r -F
complete -c cudapool -n "__fish_cudapool_using_subcommand slurm; and __fish_seen_subcommand_from checkpoint" -l restore -d 'Restore it and unlock its calls instead'
complete -c cudapool -n "__fish_cudapool_using_subcommand slurm; and __fish_seen_subcommand_from checkpoint" -s h -l help -d 'Print help'
complete -c cudapool -n "__fish_cudapool_using_subcommand slurm; and __fish_seen_subcommand_from share" -l gpus -d 'The GPUs the job has on this node (as SLURM_JOB_GPUS: 0,1)' -r
complete -c cudapool -n "__fish_cudapool_using_subcommand slurm; and __fish_seen_subcommand_from share" -l config -d 'The site\'s settings (default /etc/cudapool/slurm.conf, or CUDAPOOL_SLURM_CONFIG)' -r -F
complete -c cudapool -n "__fish_cudapool_using_subcommand slurm; and __fish_seen_subcommand_from share" -s h -l help -d 'Print help'
complete -c cudapool -n "__fish_cudapool_using_subcommand jobstat" -s h -l help -d 'Print help'
complete -c cudapool -n "__fish_cudapool_using_subcommand run" -l limit -d 'Hard limit per device (CUDAPOOL_MEMORY_LIMIT): 8GiB, 1.5G, 50%, or a per-device list 0=8GiB,1=50%; 0 means no limit. M and G are decimal (256M is 244.14 MiB; Slurm\'s gpumem:256M is 256 MiB): write MiB and GiB for binary' -r
complete -c cudapool -n "__fish_cudapool_using_subcommand run" -l pool -d 'Pool kind (CUDAPOOL_POOL): split, binned, simple or none' -r -f -a "split\t''
binned\t''
simple\t''
none\t''"
complete -c cudapool -n "__fish_cudapool_using_subcommand run" -l report -d 'Print the memory status at exit (CUDAPOOL_REPORT=stderr)'
complete -c cudapool -n "__fish_cudapool_using_subcommand run" -s h -l help -d 'Print help'
complete -c cudapool -n "__fish_cudapool_using_subcommand replay" -l segments -d 'Only these segments: classic or expandable (default: both for split)' -r -f -a "classic\t''
expandable\t''"
complete -c cudapool -n "__fish_cudapool_using_subcommand replay" -l limit -d 'Replay under this hard limit (e.g. 8GiB), as CUDAPOOL_MEMORY_LIMIT would set' -r
complete -c cudapool -n "__fish_cudapool_using_subcommand replay" -l stitch -d 'When expandable segments stitch, as CUDAPOOL_STITCH: near-limit (default) or always (their rows then read `stitching`)' -r -f -a "near-limit\t''
always\t''"
complete -c cudapool -n "__fish_cudapool_using_subcommand replay" -l pool -d 'Only this pool kind: split, binned or simple (default: each)' -r -f -a "split\t''
binned\t''
simple\t''"
complete -c cudapool -n "__fish_cudapool_using_subcommand replay" -l json -d 'One JSON object per line, per file and configuration'
complete -c cudapool -n "__fish_cudapool_using_subcommand replay" -s h -l help -d 'Print help'
