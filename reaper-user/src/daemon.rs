//! One tracing run: load and attach, seed, start the gateway command, stream events until a
//! stop condition, then detach, drain and summarise.
use std::{
    ffi::OsString,
    io::{BufWriter, Write},
    os::fd::AsFd,
    process::{ExitStatus, Stdio},
    time::Duration,
};

use anyhow::{Context, Result, anyhow, bail};
use aya::maps::{MapData, RingBuf};
use reaper_common::Tracked;
use tokio::{
    io::{Interest, unix::AsyncFd},
    process::{Child, Command},
    signal::unix::{SignalKind, signal},
    sync::mpsc::UnboundedReceiver,
    time::{Instant, sleep_until},
};

use crate::{
    capture::{
        loader::{KernelCounters, LoadOptions, Probes, ReaderIdle},
        poll_clock::PollClock,
    },
    cli::Cli,
    gateways::Selectors,
    identity,
    kill::{KillOptions, KillReport, Killer},
    leaks::{InspectOptions, flags as leaks},
    lineage::{
        graph::LineageGraph,
        seed::{self, TrackedMap},
        upkeep::FREE_LAG,
    },
    output::{
        Output,
        events::Event,
        junit::{self, JunitFile},
        lines::WholeLines,
        logfile::{LogFile, Rotation},
        serve,
        status::StatusLine,
        tree::render_alive_tree,
    },
    privileges,
    procfs::{self, Stat, boottime_now},
    text::Args,
    tracer::Tracer,
};

/// How often losses are checked and pending reparents re-read when nothing else happens.
const HOUSEKEEPING: Duration = Duration::from_millis(100);
/// How soon a child whose parent exited is looked at again.
const REPARENT_RETRY: Duration = Duration::from_millis(5);
/// Time for probes still running on another CPU to finish after detaching.
const DETACH_SETTLE: Duration = Duration::from_millis(20);

/// Runs reaper-trace; returns the process exit status.
pub async fn run(cli: Cli) -> Result<i32> {
    let t0 = boottime_now();
    if let Some(root) = &cli.proc_root {
        if !root.join("self/stat").exists() {
            bail!("--proc-root {}: not a mounted /proc", root.display());
        }
        procfs::set_root(root);
    }
    identity::check_pid_namespace(cli.proc_root.as_deref())?;
    if !identity::own_pids_are_hosts() {
        // The kernel's pids are the host's; a pidfd or a signal would take them as this
        // namespace's.
        if cli.kill {
            bail!("--kill needs the host's pid namespace: signals name pids in reaper-trace's own");
        }
        if !cli.command.is_empty() {
            bail!(
                "`-- CMD` needs the host's pid namespace (CMD's pid is this namespace's): \
                 select the gateway instead (--gateway-exe, --gateway-pid with its host pid)"
            );
        }
    }
    // Check the gateways before touching the kernel: a typo should cost nothing.
    let pid_gateways = cli
        .gateway_pid
        .iter()
        .map(|&pid| seed::check_gateway(pid, cli.allow_init))
        .collect::<Result<Vec<_>>>()?;
    let mut selectors = Selectors::from_cli(&cli)?;
    selectors.check_pidfiles()?;
    let output = output_for(&cli, t0)?;
    let junit = cli.junit.as_deref().map(JunitFile::create).transpose()?;
    let started = std::time::Instant::now();
    let metrics_listener = match cli.metrics {
        Some(addr) => Some(serve::bind(addr).await?),
        None => None,
    };

    let mut probes = Probes::load(&LoadOptions {
        max_tracked: cli.max_tracked,
        ring_bytes: cli.ring_size,
        batch_wakeups: !cli.wakeup_interval.is_zero(),
        setsid_hook: cli.setsid_hook.wanted(),
        selectors: selectors.needs(),
    })?;
    for note in &probes.notes {
        eprintln!("reaper-trace: {note}");
    }

    let graph = LineageGraph::new(cli.retain_dead);
    let inspect = InspectOptions {
        scan_interval: cli.scan_interval,
        idle_after: cli.idle_after,
        zombie_after: cli.zombie_after,
        orphan_grace: cli.orphan_grace,
        max_instances: cli.max_instances as usize,
    };
    let mut tracer = Tracer::new(graph, output, inspect);
    if let Some(listener) = metrics_listener {
        tokio::spawn(serve::serve(listener, tracer.out.metrics.registry()));
    }
    let mut kill_reports = None;
    if cli.kill {
        let (killer, reports) = Killer::new(KillOptions {
            reasons: cli.kill_reasons.0.clone(),
            grace: cli.grace,
            term_timeout: cli.term_timeout,
            dry_run: cli.dry_run,
        });
        tracer.killer = Some(killer);
        kill_reports = Some(reports);
    }

    // The kernel looks for new gateways from here on; then /proc for those already running.
    selectors.arm(&mut probes.selector_maps)?;
    tracer.set_selectors(selectors.labels());
    let mut gateways: Vec<(usize, Stat)> = pid_gateways
        .into_iter()
        .map(|stat| (Selectors::PID, stat))
        .collect();
    for (selector, stat) in selectors.running(&procfs::snapshot_all()?) {
        if !gateways.iter().any(|(_, g)| g.pid == stat.pid) {
            gateways.push((selector, stat));
        }
    }
    let gone = adopt(&gateways, &mut probes.tracked, &mut tracer)?;
    if let Some(pid) = cli.gateway_pid.iter().find(|p| gone.contains(p)) {
        bail!("--gateway-pid {pid}: the process exited during start-up");
    }
    let child = match cli.command.is_empty() {
        true => None,
        false => {
            let child = spawn_gateway(&mut probes.tracked, &cli.command, cli.json)?;
            tracer.expect_gateway(
                child
                    .id()
                    .ok_or_else(|| anyhow!("the gateway exited at once"))?,
                Args::from_list(cli.command.iter().map(|a| a.as_encoded_bytes())),
            );
            Some(child)
        }
    };
    // Attached and the gateway started: from here on, only what /proc inspection (and --kill)
    // needs. A failure leaves the run correct but less hardened: say so, go on.
    if let Err(e) = privileges::drop_all_but(&privileges::runtime_needs(cli.kill)) {
        eprintln!("reaper-trace: warning: {e:#}; keeping full privileges");
    }
    let ready = Event::Ready {
        gateway: tracer.gateway_pids(),
        tracked: probes.tracked.keys().count(),
        setsid_hook: probes.setsid_hook.name(),
        kernel: probes.features.release.clone(),
    };
    let ready_at = boottime_now();
    tracer.out.set_t0(ready_at);
    tracer.out.event(ready_at, &ready)?;
    tracer.out.flush()?;

    let mut sources = Sources {
        // SAFETY: the RingBuf owns its map fd, open and unchanged for as long as the AsyncFd.
        ring: unsafe { AsyncFd::register_with_interest(probes.ring, Interest::READABLE) }
            .map_err(|e| anyhow!("polling the ring buffer: {e}"))?,
        kernel: Kernel {
            counters: &probes.counters,
            tracked: &mut probes.tracked,
            reader_idle: &mut probes.reader_idle,
        },
        command: GatewayCommand {
            child,
            status: None,
        },
        kill_reports,
    };
    let stop = event_loop(&cli, &mut selectors, &mut tracer, &mut sources).await?;
    let Sources {
        mut ring,
        mut command,
        mut kill_reports,
        ..
    } = sources;
    // Like timeout(1): a run that ends while CMD runs ends CMD too (not its descendants:
    // what they do after their gateway is gone is what the run reports).
    if command.running() {
        command.end(&mut tracer.out, stop, cli.term_timeout).await?;
    }

    // Stop: detach, let running probes finish, take in the rest, and account for it all.
    probes.programs = None; // detaches every probe; the maps stay for the last drain
    tokio::time::sleep(DETACH_SETTLE).await;
    let losses = probes.counters.losses()?;
    drain(ring.get_mut(), &mut tracer)?;
    tracer.keep_exact(losses, &probes.tracked)?;
    tracer.release_lagging(Duration::ZERO)?;
    // Flags of processes that ended since the last scan are cleared in the stream too.
    tracer.scan_leaks()?;
    while let Some(r) = kill_reports.as_mut().and_then(|rx| rx.try_recv().ok()) {
        tracer.report_kill(r)?;
    }
    let gateway_code = command.status.map(exit_code);
    let mut status = gateway_code.unwrap_or(0);
    if cli.check {
        let (verdict, code) = tracer.check_verdict(gateway_code);
        tracer.out.event(boottime_now(), &verdict)?;
        status = code;
        if let (
            Some(file),
            Event::Check {
                verdict,
                gateway_exit_code,
                leaked,
            },
        ) = (junit, &verdict)
        {
            file.write(&junit::Verdict {
                command: Args::from_list(cli.command.iter().map(|a| a.as_encoded_bytes()))
                    .for_terminal(),
                verdict,
                gateway_exit_code: *gateway_exit_code,
                leaked,
                took: started.elapsed(),
            })?;
        }
    }
    let summary = tracer.summary(&probes.counters, gateway_code)?;
    tracer.out.event(boottime_now(), &summary)?;
    tracer.out.end_status();
    let tree = render_alive_tree(&tracer.graph, &leaks::active_by_node(&tracer.inspector));
    tracer.out.human_block(&tree)?;
    tracer.out.flush()?;
    Ok(status)
}

/// What the event loop reads besides its timers and signals.
struct Sources<'a> {
    ring: AsyncFd<RingBuf<MapData>>,
    kernel: Kernel<'a>,
    command: GatewayCommand,
    /// The kill sequences' reports; none without `--kill`.
    kill_reports: Option<UnboundedReceiver<KillReport>>,
}

/// The maps the event loop uses besides the ring.
struct Kernel<'a> {
    counters: &'a KernelCounters,
    tracked: &'a mut TrackedMap,
    reader_idle: &'a mut ReaderIdle,
}

/// The command reaper-trace started as its gateway (`-- CMD`), if any, and how it ended.
struct GatewayCommand {
    child: Option<Child>,
    status: Option<ExitStatus>,
}

/// Why the event loop stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// `--duration` passed.
    Duration,
    /// SIGINT or SIGTERM.
    Signal(&'static str),
    /// Every gateway exited and nothing tracked is left (or `--check`'s settle time passed).
    Done,
}

impl Stop {
    /// For the `stop_command` event.
    fn because(self) -> &'static str {
        match self {
            Stop::Duration => "duration",
            Stop::Signal(name) => name,
            Stop::Done => "done",
        }
    }
}

impl GatewayCommand {
    /// Started and not yet reaped.
    fn running(&self) -> bool {
        self.child.is_some() && self.status.is_none()
    }

    /// Ends the command because the run stopped: SIGTERM, then SIGKILL after `term_timeout`,
    /// each signal a `stop_command` event. Its exit is its own record in the stream; its
    /// status does not become reaper-trace's (the run ended it).
    async fn end(&mut self, out: &mut Output, stop: Stop, term_timeout: Duration) -> Result<()> {
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        // Not reaped yet (only `wait` reaps it), so the pid is still the command's own.
        let Some(pid) = child.id() else {
            return Ok(());
        };
        for (signal, number) in [("SIGTERM", libc::SIGTERM), ("SIGKILL", libc::SIGKILL)] {
            // SAFETY: a plain signal to our own unreaped child.
            unsafe { libc::kill(pid as i32, number) };
            let ev = Event::StopCommand {
                pid,
                signal,
                because: stop.because(),
            };
            out.event(boottime_now(), &ev)?;
            let wait = match number {
                libc::SIGTERM => term_timeout,
                _ => Duration::MAX,
            };
            if let Ok(status) = tokio::time::timeout(wait, child.wait()).await {
                status.context("waiting for the gateway command")?;
                self.child = None;
                return Ok(());
            }
        }
        Ok(())
    }

    /// Its exit status; never, without a command.
    async fn wait(&mut self) -> Result<ExitStatus> {
        match self.child.as_mut() {
            Some(c) => c.wait().await.context("waiting for the gateway command"),
            None => std::future::pending().await,
        }
    }
}

/// Streams events until a stop condition: the duration, a signal, or every gateway gone with
/// no tracked process left alive. Returns which.
///
/// Wake-ups are batched: while records stream, the loop polls the ring every wake-up interval
/// and no record wakes it. When a poll finds nothing, it tells the kernel it goes idle (the
/// next record then wakes it at once), polls once more to catch a record that raced that,
/// and sleeps. Housekeeping also polls, which bounds even that race's delay.
async fn event_loop(
    cli: &Cli,
    selectors: &mut Selectors,
    tracer: &mut Tracer,
    sources: &mut Sources<'_>,
) -> Result<Stop> {
    let Sources {
        ring,
        kernel,
        command,
        kill_reports,
    } = sources;
    let mut sigint = signal(SignalKind::interrupt()).context("installing a SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
    let far = Instant::now() + Duration::from_secs(86_400 * 365);
    // `--wakeup-interval 0`: every record wakes the reader (the kernel is told not to batch),
    // so there is nothing to poll for.
    let batching = !cli.wakeup_interval.is_zero();
    let mut poll = PollClock::new(cli.wakeup_interval.max(Duration::from_micros(100)))
        .context("creating the reader's poll clock (timerfd)")?;
    kernel.reader_idle.going_idle()?;
    // The timers live across iterations and are moved only when their time changes: a fresh
    // timer per wake-up is a timer-wheel insertion and removal each, on the hottest loop.
    let stop_at = sleep_until(cli.duration.map(|d| Instant::now() + d).unwrap_or(far));
    let house = sleep_until(Instant::now() + HOUSEKEEPING);
    let scan = sleep_until(Instant::now() + cli.scan_interval);
    // --check: when the gateway command's settle time is up.
    let settle = sleep_until(far);
    tokio::pin!(stop_at, house, scan, settle);
    let mut settling = false;
    let mut reparent_retry = false;
    loop {
        // A child whose parent exited is looked at again soon, not at the next tick.
        if tracer.upkeep.has_pending_reparents() && !reparent_retry {
            let soon = Instant::now() + REPARENT_RETRY;
            if soon < house.deadline() {
                house.as_mut().reset(soon);
                reparent_retry = true;
            }
        }
        // Written lines go out at once, except while records stream: then they leave in
        // full buffers and at each housekeeping tick, and all of them when the stream pauses
        // (a write per wake-up was a fifth of the reader's CPU in a fork storm).
        let mut flush = true;
        tokio::select! {
            ready = ring.readable_mut() => {
                // Clear first, then drain: a record arriving meanwhile re-arms readiness.
                ready.context("waiting on the ring buffer")?.clear_ready();
                drain(ring.get_mut(), tracer)?;
                if batching {
                    poll.start().context("starting the poll clock")?;
                }
                flush = !batching;
            }
            tick = poll.tick(), if poll.ticking() => {
                tick.context("waiting on the poll clock")?;
                let mut n = drain(ring.get_mut(), tracer)?;
                if n == 0 {
                    kernel.reader_idle.going_idle()?;
                    n = drain(ring.get_mut(), tracer)?;
                }
                if n == 0 {
                    poll.stop().context("stopping the poll clock")?;
                }
                flush = n == 0;
            }
            _ = &mut house => {
                let losses = kernel.counters.losses()?;
                drain(ring.get_mut(), tracer)?;
                tracer.keep_exact(losses, kernel.tracked)?;
                follow_pidfiles(selectors, tracer, kernel.tracked, cli.allow_init)?;
                house.as_mut().reset(Instant::now() + HOUSEKEEPING);
                reparent_retry = false;
            }
            _ = &mut scan => {
                drain(ring.get_mut(), tracer)?;
                tracer.release_lagging(FREE_LAG)?;
                tracer.scan_leaks()?;
                tracer.decide_kills()?;
                tracer.out.draw_status().context("writing output")?;
                scan.as_mut().reset(next_scan(cli.scan_interval, tracer.inspector.next_look()));
            }
            Some(report) = next_report(kill_reports) => tracer.report_kill(report)?,
            status = command.wait(), if command.running() => {
                command.status = Some(status?);
                // Its exit event may still be in the ring.
                drain(ring.get_mut(), tracer)?;
                if cli.check {
                    settle.as_mut().reset(Instant::now() + cli.settle_time());
                    settling = true;
                }
            }
            _ = &mut settle, if settling => return Ok(Stop::Done),
            _ = sigint.recv() => return Ok(Stop::Signal("SIGINT")),
            _ = sigterm.recv() => return Ok(Stop::Signal("SIGTERM")),
            _ = &mut stop_at => return Ok(Stop::Duration),
        }
        if flush {
            tracer.out.flush().context("writing output")?;
        }
        let waiting_for_more = selectors.watches();
        if !command.running()
            && !waiting_for_more
            && tracer.gateways_exited()
            && tracer.tree_finished()
        {
            return Ok(Stop::Done);
        }
    }
}

/// When the next leak scan runs: a scan interval from now, or sooner when an orphan grace
/// ends before (`grace_end`, boot-time ns).
fn next_scan(interval: Duration, grace_end: Option<u64>) -> Instant {
    let regular = Instant::now() + interval;
    let Some(end) = grace_end else {
        return regular;
    };
    let wait = Duration::from_nanos(end.saturating_sub(boottime_now()));
    regular.min(Instant::now() + wait)
}

/// Makes the pid of each rewritten pidfile a gateway (with what it already spawned, from
/// /proc). A pidfile that names no live process, or holds no pid, is reported and waited on.
fn follow_pidfiles(
    selectors: &mut Selectors,
    tracer: &mut Tracer,
    tracked: &mut TrackedMap,
    allow_init: bool,
) -> Result<()> {
    for (selector, change) in selectors.pidfile_changes() {
        let label = selectors.label(selector).to_owned();
        let stat = change.and_then(|pid| {
            seed::check_gateway(pid, allow_init)
                .map_err(|e| anyhow!("{}", e.to_string().replace("--gateway-pid", "pid")))
        });
        let stat = match stat {
            Ok(stat) => stat,
            Err(e) => {
                eprintln!("reaper-trace: {label}: {e:#}; waiting for it to change");
                continue;
            }
        };
        adopt(&[(selector, stat)], tracked, tracer)?;
    }
    Ok(())
}

/// Tracks gateways found in /proc (with the selector that found each) and what they already
/// spawned, and announces each. Returns the pids of those that exited meanwhile.
fn adopt(
    gateways: &[(usize, Stat)],
    tracked: &mut TrackedMap,
    tracer: &mut Tracer,
) -> Result<Vec<u32>> {
    let stats: Vec<Stat> = gateways.iter().map(|(_, s)| s.clone()).collect();
    let seeds = seed::seed(tracked, &stats)?;
    tracer.add_seeds(seeds)?;
    let mut gone = Vec::new();
    for (selector, stat) in gateways {
        let node = tracer
            .graph
            .current(stat.pid)
            .filter(|n| n.is_gateway && n.alive() && n.start.ticks() == stat.start_ticks);
        match node {
            Some(node) => tracer.announce(node.id, *selector, boottime_now())?,
            None => gone.push(stat.pid),
        }
    }
    Ok(gone)
}

/// The next step a kill sequence reports; never, without `--kill`.
async fn next_report(reports: &mut Option<UnboundedReceiver<KillReport>>) -> Option<KillReport> {
    match reports.as_mut() {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Reads every record now in the ring. Returns how many.
fn drain(ring: &mut RingBuf<MapData>, tracer: &mut Tracer) -> Result<usize> {
    let mut n = 0;
    while let Some(item) = ring.next() {
        tracer.record(&item)?;
        n += 1;
    }
    tracer.end_batch();
    Ok(n)
}

/// Starts the gateway command so that it is tracked before its first instruction: reaper-trace
/// tracks itself for the moment of the fork, so the kernel inserts the child at fork time.
fn spawn_gateway(tracked: &mut TrackedMap, argv: &[OsString], json: bool) -> Result<Child> {
    let me = procfs::own_pid();
    tracked
        .insert(me, Tracked { start: 0 }, 0)
        .context("tracking the gateway command")?;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    if json {
        // Keep stdout for the NDJSON stream.
        let stderr = std::io::stderr().as_fd().try_clone_to_owned()?;
        cmd.stdout(Stdio::from(stderr));
    }
    let spawned = cmd.spawn();
    let _ = tracked.remove(&me);
    spawned.with_context(|| format!("cannot start {:?}", argv[0]))
}

/// The shell convention: the exit code, or 128 + the signal that killed it.
fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

fn output_for(cli: &Cli, t0: u64) -> Result<Output> {
    let stdout =
        || Box::new(BufWriter::with_capacity(64 << 10, std::io::stdout())) as Box<dyn Write + Send>;
    let stderr =
        || Box::new(BufWriter::with_capacity(64 << 10, std::io::stderr())) as Box<dyn Write + Send>;
    let mut json = Vec::new();
    if cli.json {
        json.push(stdout());
    }
    if let Some(path) = &cli.output {
        let rotation = cli.rotate_size.map(|size| Rotation {
            size,
            keep: cli.rotate_keep,
        });
        json.push(Box::new(LogFile::open(path, rotation)?) as Box<dyn Write + Send>);
    }
    // `-- CMD` writes to the same stdout and stderr: readable lines then go out whole, so
    // neither side splits the other's lines.
    let shared = !cli.command.is_empty();
    let human = match (cli.quiet, cli.json, shared) {
        (true, _, _) => None,
        (false, true, false) => Some(stderr()),
        (false, false, false) => Some(stdout()),
        (false, true, true) => Some(Box::new(WholeLines::new(std::io::stderr())) as Box<_>),
        (false, false, true) => Some(Box::new(WholeLines::new(std::io::stdout())) as Box<_>),
    };
    let mut out = Output::new(json, human, t0);
    out.set_findings_only(cli.check && !cli.verbose);
    out.set_status(StatusLine::for_stderr(!cli.quiet));
    Ok(out)
}
