//! Command line of `reaper-trace`.
use std::{ffi::OsString, net::SocketAddr, path::PathBuf, time::Duration};

use clap::Parser;

use crate::capture::loader::SetsidHook;
use crate::leaks::Reason;
use crate::lineage::sessions::Source;

mod values;
use values::{parse_api, parse_group};
pub use values::{
    parse_duration, parse_kill_reasons, parse_listen_addr, parse_reason, parse_ring_size,
    parse_rotate_size, parse_session_env, parse_size,
};

/// `--version`: the release and the git commit it was built from.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("REAPER_COMMIT"),
    ")"
);

/// Trace every descendant of a gateway process with eBPF: an exact spawn-lineage graph,
/// however the descendants escaped (setsid, double fork, reparenting).
///
/// Runs as root. Either attach to running gateways (`--gateway-pid`), or start one:
/// `reaper-trace [OPTIONS] -- CMD [ARGS...]`, traced from its first instruction; then the exit
/// status follows CMD's.
///
/// `reaper-trace report AUDIT.ndjson -o report.html` turns an audit (`--json` or `--output`)
/// into one HTML page: see `reaper-trace report --help`. `reaper-trace why PID` asks the
/// running audits about one process: see `reaper-trace why --help`.
#[derive(Debug, Parser)]
#[command(name = "reaper-trace", version = VERSION)]
pub struct Cli {
    /// A running process to trace with all its descendants (repeatable).
    #[arg(long = "gateway-pid", value_name = "PID", value_parser = clap::value_parser!(u32).range(1..))]
    pub gateway_pid: Vec<u32>,

    /// Every process that executes PATH is a gateway: those running at start and each one
    /// started later, matched in the kernel at exec (tracked before it can fork). A binary is
    /// matched by its inode (any path or link to it); a `#!` script by the path it is run by
    /// (PATH or its resolved target). Repeatable; the run then lasts until --duration or a
    /// signal, across the gateway's restarts.
    #[arg(long = "gateway-exe", value_name = "PATH")]
    pub gateway_exe: Vec<PathBuf>,

    /// The processes of a systemd unit are gateways: its cgroup, as with --gateway-cgroup
    /// (asked of systemd; without systemd, the cgroup directory named after the unit).
    #[arg(long = "gateway-unit", value_name = "NAME")]
    pub gateway_unit: Vec<String>,

    /// The processes of a cgroup v2 directory (and those under it) whose parent is outside it
    /// are gateways: at start, and each one moved or started into it later, matched in the
    /// kernel (a restarted unit's or container's new cgroup at the same path included).
    #[arg(long = "gateway-cgroup", value_name = "PATH")]
    pub gateway_cgroup: Vec<PathBuf>,

    /// The pid in FILE is a gateway, read at start and again whenever FILE is rewritten.
    #[arg(long = "gateway-pidfile", value_name = "FILE")]
    pub gateway_pidfile: Vec<PathBuf>,

    /// Read processes in the host's /proc mounted at PATH (a container without the host's pid
    /// namespace: e.g. a DaemonSet mounting /proc at /host/proc). Without the host's pid
    /// namespace, no pidfds: --kill and `-- CMD` are refused, and neither `deaf` nor `idle` is
    /// judged (whether a channel's other end is open is asked of the fd through a pidfd).
    #[arg(long, value_name = "PATH")]
    pub proc_root: Option<PathBuf>,

    /// Keep the audit in DIR (made 0700) across restarts: the probes stay attached and their
    /// maps and ring pinned in bpffs (under /sys/fs/bpf/reaper-trace/), so what happens while
    /// no run reads waits in the ring; the lineage is written to DIR every second and at the
    /// stop. The next run with the same DIR and selectors takes both back and reads the gap's
    /// events in order (see docs/operations.md). `--release-state DIR` removes it all.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// With --state-dir: when no run has read the ring for this long, the probes stop
    /// recording (they keep only the tracked set exact), so a forgotten state costs the host
    /// little; the next run reports that gap as lost and repairs it from /proc.
    #[arg(long, value_name = "DUR", default_value = "15m", value_parser = parse_duration, requires = "state_dir")]
    pub state_keep: Duration,

    /// Remove what --state-dir DIR kept, and exit.
    #[arg(long, value_name = "DIR", conflicts_with = "state_dir")]
    pub release_state: Option<PathBuf>,

    /// Mount bpffs at /sys/fs/bpf unless one is there, and exit: what --state-dir needs of a
    /// host, done by a privileged step (CAP_SYS_ADMIN) before a run that keeps only its own
    /// capabilities, such as the DaemonSet's init container (see docs/operations.md).
    #[arg(long, conflicts_with_all = ["state_dir", "release_state"])]
    pub mount_bpffs: bool,

    /// Write NDJSON events to stdout (one object per line); readable lines go to stderr, and
    /// CMD's own stdout is sent to stderr so the stream stays clean.
    #[arg(long)]
    pub json: bool,

    /// No readable lines and no status line (with --json: only the NDJSON stream).
    #[arg(long)]
    pub quiet: bool,

    /// Also write the NDJSON stream to FILE (appending), alongside what goes to the terminal.
    /// A full disk does not stop tracing: lines wait in memory and the error is reported.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// With --output: start a new file when this one would pass SIZE (e.g. 100MiB); the old
    /// ones are kept as FILE.1 (newest), FILE.2, ...
    #[arg(long, value_name = "SIZE", value_parser = parse_rotate_size)]
    pub rotate_size: Option<u64>,

    /// With --rotate-size: how many rotated files to keep (0: the file starts over empty).
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub rotate_keep: u32,

    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464). Binds only
    /// where told: keep it on loopback unless the port is firewalled.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen_addr)]
    pub metrics: Option<SocketAddr>,

    /// Serve the run's read-only API (asked by `reaper-trace why PID`) on this UNIX socket
    /// (mode 0600): `auto` is /run/reaper-trace/PID.sock (PID: reaper-trace's own), `off`
    /// serves none.
    #[arg(long, value_name = "SOCKET", default_value = "auto", value_parser = parse_api)]
    pub api: Api,

    /// Open the API's socket to this group too (a name or a number): mode 0660, and its
    /// members' connections are taken (root and reaper-trace's own user always are).
    #[arg(long, value_name = "GROUP", value_parser = parse_group)]
    pub api_group: Option<u32>,

    /// Stop after this long (e.g. 30s, 10m, 2h). Otherwise: on SIGINT/SIGTERM, or when the
    /// gateways have exited and no tracked process is left (never, with a selector other than
    /// --gateway-pid: a gateway may start again).
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// Capacity of the in-kernel map of tracked processes. When it is full, new children are
    /// reported but not followed, and the loss is reported.
    #[arg(long, value_name = "N", default_value_t = 65_536, value_parser = clap::value_parser!(u32).range(16..))]
    pub max_tracked: u32,

    /// Size of the kernel→user ring buffer (a power of two, at least 4KiB; e.g. 16MiB).
    #[arg(long, value_name = "BYTES", default_value = "4MiB", value_parser = parse_ring_size)]
    pub ring_size: u32,

    /// While events stream, how often the reader takes them in at first; it widens to 16ms
    /// while they keep coming. The first event after a quiet spell wakes it at once. Batching
    /// wake-ups is what keeps tracing cheap under a fork storm; 0 wakes the reader for every
    /// event.
    // A record that comes just after a poll waits a whole interval, then for the reader to
    // be scheduled: at 1.5 ms the p99 of lone records read 2.04 to 2.08 ms, at 1 ms 1.16 to
    // 1.67 ms (50 ms and 8 ms apart, BENCHMARKS.md). 1.5 ms had been chosen over 1 ms when
    // records at 1 ms waited for the 100 ms housekeeping tick: a lost wake-up at any
    // interval, fixed since (docs/design.md).
    #[arg(long, value_name = "DUR", default_value = "1ms", value_parser = parse_duration)]
    pub wakeup_interval: Duration,

    /// How setsid() is observed: `auto` uses the syscalls/sys_exit_setsid tracepoint (mounting
    /// tracefs if needed) and falls back to the raw sys_exit tracepoint, then to none.
    #[arg(long, value_enum, value_name = "HOOK", default_value_t = SetsidHookArg::Auto)]
    pub setsid_hook: SetsidHookArg,

    /// Take a tracked spawner's stack at each fork, and name the code that spawned each
    /// flagged process (`spawned_at`): `native` walks frame pointers (each frame taken as its
    /// object's build id and offset, so a spawner gone by the flag is named); `auto` adds a Python
    /// spawner's own frames (CPython 3.11 to 3.14), read from its interpreter, copies a Node
    /// host's stack at each fork to unwind it (its JavaScript named from its perf map, under
    /// NODE_OPTIONS=--perf-basic-prof), and any other spawner's once per site, unwound with its
    /// objects' call frame information (C through the C library, Rust's Command); `off` takes
    /// nothing.
    #[arg(long, value_enum, value_name = "WHAT", default_value_t = SpawnStacks::Auto)]
    pub spawn_stacks: SpawnStacks,

    /// An environment variable that names the agent session a process is for (repeatable):
    /// the first of them (in their order) a process's environment sets is its session, a value
    /// of reaper-trace's own environment or the gateway's apart, and a process naming none is
    /// in its spawner's. By default the agent hosts' own; `none` reads no session.
    #[arg(
        long,
        value_name = "NAME",
        value_parser = parse_session_env,
        default_values = crate::lineage::sessions::DEFAULT_NAMES
    )]
    pub session_env: Vec<String>,

    /// A process's session is the cgroup directly below its gateway's that it runs in (a
    /// gateway that makes a cgroup of its own for each session below its own), instead of an
    /// environment variable's value.
    #[arg(long, conflicts_with = "session_env")]
    pub session_cgroup: bool,

    /// Exited and reaped processes to keep in the graph for lineage and reports (ancestors of
    /// live processes are always kept).
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub retain_dead: usize,

    /// How often the leak inspector looks at the live descendants in /proc. Each one is read
    /// in full only every max(this, --idle-after / 4), or at once when its spawn chain breaks
    /// (or at the next scan after an exec).
    #[arg(long, value_name = "DUR", default_value = "1s", value_parser = parse_duration)]
    pub scan_interval: Duration,

    /// Flag `idle` a descendant that waits for input and moved no data for this long, and
    /// `deaf` one that reads a pipe or socket whose other end is gone for this long.
    #[arg(long, value_name = "DUR", default_value = "10m", value_parser = parse_duration)]
    pub idle_after: Duration,

    /// Flag `orphaned` a descendant whose spawn chain broke only if it still holds a pipe or
    /// socket to another process this long after the break: servers that exit on EOF when
    /// their gateway crashed are never flagged.
    #[arg(long, value_name = "DUR", default_value = "2s", value_parser = parse_duration)]
    pub orphan_grace: Duration,

    /// Flag `accumulating` every instance but the N newest when more than N instances of one
    /// kind (the same executable, positional arguments and option names; option values may
    /// differ) are alive under one gateway instance. A server and its wrappers are one
    /// instance.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_instances: u32,

    /// Flag `zombie` a descendant that exited and was not reaped for this long.
    #[arg(long, value_name = "DUR", default_value = "60s", value_parser = parse_duration)]
    pub zombie_after: Duration,

    /// Leak gate: run CMD; after it exits and --settle has passed, report every descendant
    /// still alive and every zombie, and exit 3 if there are any (4 if CMD failed and nothing
    /// leaked, 0 if neither).
    #[arg(long)]
    pub check: bool,

    /// With --check: a readable line for every event, not only the findings. By default
    /// --check shows people only the flags, kills, losses, the CHECK verdict and the summary
    /// (a CI log stays short); the NDJSON stream (--json, --output) always has every event.
    #[arg(long)]
    pub verbose: bool,

    /// With --check: also write the verdict to FILE as a JUnit XML report for a CI system's
    /// test view: one failed test case a process left behind (named by its argv; lineage and
    /// evidence in the failure), one passed case when nothing was.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,

    /// With --check: how long to wait after CMD exits for its descendants to finish
    /// (default 2s).
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub settle: Option<Duration>,

    /// Kill flagged processes (see --kill-reasons), through pidfds, after --grace: SIGCONT if
    /// stopped, SIGTERM, SIGKILL after --term-timeout. Off by default: only observe.
    #[arg(long)]
    pub kill: bool,

    /// With --kill: the flags that lead to a kill, comma-separated: orphaned, deaf, idle,
    /// accumulating (the older instances, oldest first; never the --max-instances newest).
    #[arg(long, value_name = "LIST", default_value = "orphaned,deaf", value_parser = parse_kill_reasons)]
    pub kill_reasons: KillReasons,

    /// With --kill: how long a flag must hold, counted from when it is written, before the
    /// first signal.
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = parse_duration)]
    pub grace: Duration,

    /// With --kill, for a kill asked through the API (`reaper-trace kill`), and for the
    /// `-- CMD` gateway when the run ends before it: how long SIGTERM has before SIGKILL.
    #[arg(long, value_name = "DUR", default_value = "5s", value_parser = parse_duration)]
    pub term_timeout: Duration,

    /// With --kill: decide and report, send nothing.
    #[arg(long)]
    pub dry_run: bool,

    /// Accept pid 1 as a gateway (then every process on the host is a descendant).
    #[arg(long)]
    pub allow_init: bool,

    /// The gateway command to start and trace (after `--`).
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// `--setsid-hook` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SetsidHookArg {
    Auto,
    Tracepoint,
    RawSyscalls,
    None,
}

impl SetsidHookArg {
    /// The hook asked for; `None` for the best available.
    pub fn wanted(self) -> Option<SetsidHook> {
        match self {
            SetsidHookArg::Auto => None,
            SetsidHookArg::Tracepoint => Some(SetsidHook::Tracepoint),
            SetsidHookArg::RawSyscalls => Some(SetsidHook::RawSyscalls),
            SetsidHookArg::None => Some(SetsidHook::None),
        }
    }
}

/// `--spawn-stacks` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SpawnStacks {
    Off,
    Native,
    Auto,
}

impl SpawnStacks {
    /// What the probes take (`ProbeConfig::spawn_stacks`).
    pub fn bits(self) -> u64 {
        use reaper_common::{SPAWN_STACKS_COPY, SPAWN_STACKS_NATIVE, SPAWN_STACKS_PYTHON};
        match self {
            SpawnStacks::Off => 0,
            SpawnStacks::Native => SPAWN_STACKS_NATIVE,
            SpawnStacks::Auto => SPAWN_STACKS_NATIVE | SPAWN_STACKS_PYTHON | SPAWN_STACKS_COPY,
        }
    }
}

/// Where `--api` serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Api {
    /// `/run/reaper-trace/PID.sock`; a run that cannot make it goes on without (a note says
    /// why).
    Auto,
    Off,
    /// Where told: a run that cannot listen there fails at start.
    At(PathBuf),
}

/// `--kill-reasons`: the flags a kill may follow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KillReasons(pub Vec<Reason>);

impl Cli {
    /// Where each process's session is read: its cgroup (`--session-cgroup`), or the
    /// variables `--session-env` names; none with `--session-env none`.
    pub fn session_source(&self) -> Option<Source> {
        if self.session_cgroup {
            return Some(Source::Cgroup);
        }
        if self.session_env.iter().any(|n| n == "none") {
            return None;
        }
        let names = self.session_env.iter().map(|n| n.as_bytes().to_vec());
        Some(Source::environment(names.collect()))
    }

    /// Checks what clap cannot: there is something to trace.
    pub fn validate(&self) -> Result<(), String> {
        // The options that do one thing to the host and exit.
        let one_shot = match (self.mount_bpffs, &self.release_state) {
            (true, _) => Some("--mount-bpffs only mounts bpffs"),
            (false, Some(_)) => Some("--release-state DIR only removes a state"),
            (false, None) => None,
        };
        if let Some(what) = one_shot {
            return match self.gateway_pid.is_empty() && self.command.is_empty() {
                true => Ok(()),
                false => Err(format!("{what}: it traces nothing")),
            };
        }
        let selectors = self.gateway_exe.len()
            + self.gateway_unit.len()
            + self.gateway_cgroup.len()
            + self.gateway_pidfile.len();
        if self.gateway_pid.is_empty() && self.command.is_empty() && selectors == 0 {
            return Err(
                "nothing to trace: give --gateway-pid PID, --gateway-exe PATH, \
                        --gateway-unit NAME, --gateway-cgroup PATH, --gateway-pidfile FILE \
                        or a command after `--`"
                    .into(),
            );
        }
        if self.state_dir.is_some() && !self.command.is_empty() {
            return Err(
                "--state-dir keeps an audit across restarts; a `-- CMD` run ends with \
                        its command: select the gateway instead (--gateway-exe, --gateway-unit)"
                    .into(),
            );
        }
        if self.check && self.command.is_empty() {
            return Err("--check runs a command: give it after `--`".into());
        }
        if self.junit.is_some() && !self.check {
            return Err("--junit only applies with --check".into());
        }
        if self.settle.is_some() && !self.check {
            return Err("--settle only applies with --check".into());
        }
        if self.verbose && !self.check {
            return Err(
                "--verbose only applies with --check (without it every event is shown)".into(),
            );
        }
        let kill_only = [
            (self.dry_run, "--dry-run"),
            (self.grace != Duration::from_secs(30), "--grace"),
            (
                self.term_timeout != Duration::from_secs(5) && self.command.is_empty(),
                "--term-timeout",
            ),
            (
                self.kill_reasons != parse_kill_reasons("orphaned,deaf")?,
                "--kill-reasons",
            ),
        ];
        if let Some((_, flag)) = kill_only.iter().find(|(set, _)| *set && !self.kill) {
            return Err(format!("{flag} only applies with --kill"));
        }
        if self.rotate_size.is_some() && self.output.is_none() {
            return Err("--rotate-size only applies with --output".into());
        }
        if self.rotate_keep != 5 && self.rotate_size.is_none() {
            return Err("--rotate-keep only applies with --rotate-size".into());
        }
        if self.scan_interval < Duration::from_millis(100) {
            return Err("--scan-interval must be at least 100ms".into());
        }
        if self.api_group.is_some() && self.api == Api::Off {
            return Err("--api-group opens the API's socket: not with --api off".into());
        }
        Ok(())
    }

    /// With --check: the settle time (default 2s).
    pub fn settle_time(&self) -> Duration {
        self.settle.unwrap_or(Duration::from_secs(2))
    }
}

#[cfg(test)]
mod tests;
