//! One tracing run: load and attach, seed, start the gateway command, stream events until a
//! stop condition, then detach, drain and summarise. The parts and the path a record takes
//! through them are [`pipeline`]'s; the loop that drives them on their timers is
//! [`event_loop`]'s; the `-- CMD` gateway is [`command`]'s.
mod answers;
mod checkpoints;
mod command;
mod descriptors;
mod dozing;
mod event_loop;
mod kept;
mod outlets;
pub mod pipeline;
mod rounds;
mod servers;
mod session_reads;
mod slice;
mod unwinds;
mod worker;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use tokio::io::{Interest, unix::AsyncFd};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::{
    capture::loader::{Attached, Kept, LoadOptions, Probes, StackMaps},
    cli::{Cli, SpawnStacks},
    gateways::{self, Selectors},
    identity,
    kill::{KillOptions, KillReport, Killer},
    leaks::InspectOptions,
    lineage::{
        graph::LineageGraph,
        seed::{self, TrackedMap},
        sessions::Sessions,
    },
    output::{
        Output,
        junit::{self, JunitFile},
        serve as output_serve,
    },
    privileges,
    procfs::{self, Stat, boottime_now},
    sites::SpawnSites,
    state::{self, StateDir, StateLock, Taken},
    stream::{
        Stamped,
        events::{Check, Event, Ready, SCHEMA_VERSION},
    },
    text::Args,
};
use checkpoints::Checkpoints;
use command::Stop;
use command::{GatewayCommand, exit_code, spawn_gateway};
use event_loop::{Signals, Sources, drain, event_loop};
use kept::{resume, settle_kept, traced};
use outlets::{API_QUEUE, api_socket, output_for};
use pipeline::Pipeline;
use servers::Servers;

/// Time for probes still running on another CPU to finish after detaching.
const DETACH_SETTLE: Duration = Duration::from_millis(20);

/// Runs reaper-trace; returns the process exit status.
pub async fn run(cli: Cli) -> Result<i32> {
    let tracing = start(&cli).await?;
    // The API's answers are a task of their own beside the event loop, on this thread: the
    // run's parts stay on it (`Rc`, `RefCell`), and the answers borrow them between the event
    // loop's wake-ups.
    let local = tokio::task::LocalSet::new();
    local.run_until(trace(&cli, tracing)).await
}

/// The event loop, with the API's answers beside it, until a stop; then the close.
async fn trace(cli: &Cli, mut tracing: Tracing) -> Result<i32> {
    // The slow side's threads, started once privileges are dropped (capabilities are a
    // thread's): one for the answers, so that a `why` never waits behind a round's looks.
    let answers = match tracing.queries.take() {
        Some(queries) => {
            let slow = worker::Worker::start("reaper-answers")?;
            let task = answers::answer_all(tracing.run.clone(), queries, slow);
            Some(tokio::task::spawn_local(task))
        }
        None => None,
    };
    let slow = worker::Worker::start("reaper-rounds")?;
    let mut rounds = rounds::Rounds::new(tracing.run.clone(), slow);
    let slow = dozing::Dozing::start("reaper-sessions")?;
    let mut sessions = session_reads::SessionReads::new(slow);
    if tracing.run.borrow().names_spawn_sites() {
        let unwinds = unwinds::Unwinds::start()?;
        tracing.run.borrow_mut().unwind_on(unwinds);
    }
    // The reader's thread alone: the slow side's threads, started before, keep the default,
    // and what starts after does not inherit it.
    slice::ask_short_slice();
    let stop = event_loop(
        cli,
        &mut tracing.selectors,
        &tracing.run,
        &mut tracing.sources,
        &mut rounds,
        &mut sessions,
    )
    .await;
    // The answers and a round under way end before the close takes the run's parts (a
    // question asked from here is told the run is ending; a round judged is written by the
    // close).
    // Both aborted before either is awaited: an await lets the other run on.
    rounds.abort();
    if let Some(answers) = answers {
        answers.abort();
        let _ = answers.await;
    }
    let stopped = rounds.stop().await;
    let read = sessions.stop(&mut tracing.run.borrow_mut());
    let stop = stop?;
    stopped?;
    read?;
    close(cli, tracing, stop).await
}

/// A run between its start and its stop: each part with its owner.
struct Tracing {
    /// Borrowed by the event loop at each wake-up and by the API's answers between.
    run: Rc<RefCell<Pipeline>>,
    /// The API's questions; none with `--api off`.
    queries: Option<tokio::sync::mpsc::Receiver<crate::api::Query>>,
    selectors: Selectors,
    sources: Sources,
    /// The probes: dropped (detached) at the stop, unless a kept state's go on.
    attached: Attached,
    /// `--junit`'s file, written at the stop.
    junit: Option<JunitFile>,
    /// When the run started, for `--junit`'s time.
    started: std::time::Instant,
    /// `--state-dir`'s lock, held until the run ends.
    _held: Option<StateLock>,
    /// The API and the metrics, closed when the run ends.
    servers: Servers,
}

/// Checks what was asked, takes back the state directory, loads and attaches the probes,
/// seeds the lineage, starts the `-- CMD` gateway, and writes `ready`.
async fn start(cli: &Cli) -> Result<Tracing> {
    let t0 = boottime_now();
    if let Some(root) = &cli.proc_root {
        if !root.join("self/stat").exists() {
            bail!("--proc-root {}: not a mounted /proc", root.display());
        }
        procfs::set_root(root);
    }
    identity::check_pid_namespace(cli.proc_root.as_deref())?;
    // A failure leaves the limit as it was: the servers' caps stay far below any usual one.
    let fd_limits = descriptors::raise().ok();
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
    let (pid_gateways, exited_gateways) = seed::check_gateways(&cli.gateway_pid, cli.allow_init)?;
    let mut selectors = Selectors::asked(&gateways::Asked {
        exes: &cli.gateway_exe,
        units: &cli.gateway_unit,
        cgroups: &cli.gateway_cgroup,
        pidfiles: &cli.gateway_pidfile,
    })?;
    selectors.check_pidfiles()?;
    // A state that cannot be taken back stops the run before the kernel is touched.
    let traced = traced(cli, &selectors);
    let state = cli.state_dir.as_deref().map(StateDir::open).transpose()?;
    let held = state.as_ref().map(StateDir::lock).transpose()?;
    let (taken, notices) = match &state {
        Some(dir) => state::take(dir, &traced)?,
        None => (Taken::Nothing, Vec::new()),
    };
    if let Some((_, e)) = exited_gateways
        .into_iter()
        .find(|&(pid, _)| !taken.holds_gateway(pid))
    {
        return Err(e);
    }
    let kept = match &state {
        Some(dir) => Some(Kept {
            pins: dir.pins()?,
            keep: cli.state_keep,
            previous: match &taken {
                Taken::Whole { mark, .. } => Some(*mark),
                _ => None,
            },
        }),
        None => None,
    };
    let mut output = output_for(cli, t0)?;
    for notice in &notices {
        output.note(notice)?;
    }
    let junit = cli.junit.as_deref().map(JunitFile::create).transpose()?;
    let started = std::time::Instant::now();
    let metrics_listener = match cli.metrics {
        Some(addr) => Some(output_serve::bind(addr)?),
        None => None,
    };
    // Bound before privileges are dropped (/run is root's).
    let api = api_socket(cli, &mut output)?;

    crate::resident::keep_large_blocks_apart();
    let Probes {
        attached,
        ring,
        mut kernel,
        mut selector_maps,
        stacks,
        facts,
    } = Probes::load(&LoadOptions {
        max_tracked: cli.max_tracked,
        ring_bytes: cli.ring_size,
        wakeup_interval: cli.wakeup_interval,
        setsid_hook: cli.setsid_hook.wanted(),
        selectors: selectors.needs(),
        kept,
        spawn_stacks: cli.spawn_stacks.bits(),
    })?;
    for note in &facts.notes {
        output.note(note)?;
    }
    // Loading parsed the kernel's BTF (some 20 MB, freed now): give those pages back, or the
    // allocator keeps them resident for the whole run.
    crate::resident::give_back_freed();

    let registry = output.metrics.registry();
    let (api_queries, asked) = match api.is_some() {
        true => {
            let (queries, asked) = tokio::sync::mpsc::channel(API_QUEUE);
            (Some(queries), Some(asked))
        }
        false => (None, None),
    };
    let (mut run, kill_reports) = pipeline_for(cli, output, stacks, selectors.labels());

    // The lineage of the run before first: /proc then adds only what is new.
    let (resumed, whole) = resume(&taken, &state, &facts, &mut kernel.tracked, &mut run, t0)?;
    // The kernel looks for new gateways from here on; then /proc for those already running.
    // A state taken back whole needs no look: its probes kept looking, and their records
    // of the gap (new gateways among them) wait in the ring. A look would take what they
    // already know for new (a forked copy of a gateway script looks like one).
    selectors.arm(&mut selector_maps)?;
    let mut gateways: Vec<(usize, Stat)> = pid_gateways
        .into_iter()
        .filter(|stat| !whole || !run.is_gateway(stat.pid))
        .map(|stat| (Selectors::PID, stat))
        .collect();
    if !whole {
        for (selector, stat) in selectors.running(&procfs::snapshot_all()?) {
            if !gateways.iter().any(|(_, g)| g.pid == stat.pid) {
                gateways.push((selector, stat));
            }
        }
    }
    let roots = match whole {
        true => Vec::new(),
        false => run.alive_pids(),
    };
    let gone = adopt(&gateways, &roots, &mut kernel.tracked, &mut run)?;
    if let Some(pid) = cli.gateway_pid.iter().find(|p| gone.contains(p)) {
        bail!("--gateway-pid {pid}: the process exited during start-up");
    }
    let child = match cli.command.is_empty() {
        true => None,
        false => {
            let child = spawn_gateway(&mut kernel.tracked, &cli.command, cli.json, fd_limits)?;
            run.expect_gateway(
                child
                    .id()
                    .ok_or_else(|| anyhow!("the gateway exited at once"))?,
                Args::from_list(cli.command.iter().map(|a| a.as_encoded_bytes())),
            );
            Some(child)
        }
    };
    // Attached and the gateway started: from here on, only what /proc inspection needs, and
    // killing with --kill or while the API may be asked to (root's `reaper-trace kill` may
    // end another user's process). A failure leaves the run correct but less hardened: say
    // so, go on.
    let may_kill = cli.kill || cli.api != crate::cli::Api::Off;
    let note = match privileges::drop_all_but(&privileges::runtime_needs(may_kill)) {
        Ok(None) => None,
        Ok(Some(refused)) => Some(format!(
            "warning: {refused:#}; the bounding set keeps what it still holds (no_new_privs \
             and the emptied inheritable and ambient sets keep that out of reach); every \
             other capability was given up"
        )),
        Err(e) => Some(format!("warning: {e:#}; keeping full privileges")),
    };
    if let Some(note) = note {
        run.output().note(&note)?;
    }
    // The outlets are written on threads of their own from now on (a stalled stdout or disk
    // never holds the ring), and serving starts, on a thread of its own: capabilities are
    // each thread's, and the drop above needs this one alone.
    run.output().detach_outlets()?;
    // The listeners were bound before (a privileged port, /run): a client that came
    // meanwhile waits in their backlog.
    let servers = Servers::start(metrics_listener, registry, api, api_queries, cli.api_group)?;
    let ready = Event::Ready(Ready {
        schema: SCHEMA_VERSION,
        gateway: run.gateway_pids(),
        tracked: kernel.tracked.keys().count(),
        setsid_hook: facts.setsid_hook.name().into(),
        kernel: facts.features.release.clone(),
        booted_at_unix_ns: crate::procfs::booted_at_unix_ns(),
        resumed,
    });
    let signals = Signals::catch()?;
    let ready_at = boottime_now();
    run.output().set_t0(ready_at);
    run.write([Stamped::new(ready_at, ready)])?;
    run.output().ready_written()?;
    run.output().flush()?;

    let checkpoints = match state {
        Some(dir) => {
            let pins = dir.pins()?.path().to_owned();
            let boot = state::boot_id()?;
            Some(Checkpoints::new(dir, traced, boot, facts.generation, pins))
        }
        None => None,
    };
    let sources = Sources {
        // SAFETY: the RingBuf owns its map fd, open and unchanged for as long as the AsyncFd.
        ring: unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| anyhow!("polling the ring buffer: {e}"))?,
        kernel,
        command: GatewayCommand {
            child,
            status: None,
        },
        kill_reports,
        checkpoints,
        signals,
    };
    Ok(Tracing {
        run: Rc::new(RefCell::new(run)),
        queries: asked,
        selectors,
        sources,
        attached,
        junit,
        started,
        _held: held,
        servers,
    })
}

/// The run's parts as `cli` asks for them, writing to `output`, with the kill sequences'
/// reports (`--kill`) and the spawn sites read from `stacks` (`--spawn-stacks`);
/// `selector_labels`: the selectors' names, by number.
fn pipeline_for(
    cli: &Cli,
    output: Output,
    stacks: StackMaps,
    selector_labels: Vec<String>,
) -> (Pipeline, Option<UnboundedReceiver<KillReport>>) {
    // Always there: a kill may be asked for through the API; flags lead to kills with --kill.
    let (killer, kill_reports) = Killer::new(KillOptions {
        auto: cli.kill,
        reasons: cli.kill_reasons.0.clone(),
        grace: cli.grace,
        term_timeout: cli.term_timeout,
        dry_run: cli.dry_run,
    });
    let kill_reports = Some(kill_reports);
    let mut run = Pipeline::new(
        LineageGraph::new(cli.retain_dead),
        output,
        InspectOptions {
            scan_interval: cli.scan_interval,
            idle_after: cli.idle_after,
            zombie_after: cli.zombie_after,
            orphan_grace: cli.orphan_grace,
            max_instances: cli.max_instances as usize,
        },
        killer,
        cli.kill_reasons.0.clone(),
        selector_labels,
    );
    if matches!(cli.spawn_stacks, SpawnStacks::Native | SpawnStacks::Auto) {
        let interpreters = cli.spawn_stacks == SpawnStacks::Auto;
        run.name_spawn_sites(SpawnSites::new(stacks, interpreters));
    }
    if let Some(source) = cli.session_source() {
        run.read_sessions(Sessions::new(source));
    }
    (run, kill_reports)
}

/// Stops the run: ends the `-- CMD` gateway if it still runs, detaches the probes (unless a
/// kept state's go on), takes in the last records, writes the last findings, the verdict and
/// the summary, and the last checkpoint. Returns the exit status.
async fn close(cli: &Cli, tracing: Tracing, stop: Stop) -> Result<i32> {
    let Tracing {
        run,
        sources,
        attached,
        junit,
        started,
        servers,
        ..
    } = tracing;
    let mut run = Rc::try_unwrap(run)
        .map_err(|_| anyhow!("the API's answers or a round still held the run at its close"))?
        .into_inner();
    // A round being judged when the run stopped is judged to its end now, against the graph
    // as the stop found it (not once CMD is ended and the last records drained: what a stop
    // leaves is half torn down, see `Pipeline::clear_ended`); the commit below writes it.
    run.finish_judging();
    let Sources {
        mut ring,
        mut kernel,
        mut command,
        mut kill_reports,
        mut checkpoints,
        ..
    } = sources;
    // Like timeout(1): a run that ends while CMD runs ends CMD too (not its descendants:
    // what they do after their gateway is gone is what the run reports).
    if command.running() {
        command.end(&mut run, stop, cli.term_timeout).await?;
    }

    // Stop: detach, let running probes finish, take in the rest, and account for it all. A
    // kept state's probes go on: what they record from here waits in the ring for the next
    // run, and the account is taken where everything numbered was taken in or counted lost.
    let account = match checkpoints.is_some() {
        false => {
            drop(attached); // the maps stay for the last drain
            tokio::time::sleep(DETACH_SETTLE).await;
            let account = kernel.counters.account()?;
            drain(ring.get_mut(), &mut run, &mut kernel.marks)?;
            account
        }
        true => {
            settle_kept(
                ring.get_mut(),
                &mut run,
                &kernel.counters,
                &mut kernel.marks,
            )
            .await?
        }
    };
    let losses = account.losses;
    run.keep_exact(losses, &kernel.tracked)?;
    run.release_lagging(Duration::ZERO)?;
    // Flags of processes that ended since the last scan are cleared in the stream too.
    // A round judged before the stop, written (no kill starts now); then the stop's own look.
    run.commit_round(false)?;
    run.clear_ended()?;
    while let Some(r) = kill_reports.as_mut().and_then(|rx| rx.try_recv().ok()) {
        run.report_kill(r)?;
    }
    let gateway_code = command.status.map(exit_code);
    let mut status = gateway_code.unwrap_or(0);
    if cli.check {
        let (verdict, code) = run.check_verdict(gateway_code)?;
        status = code;
        if let (
            Some(file),
            Event::Check(Check {
                verdict,
                gateway_exit_code,
                leaked,
            }),
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
    run.close(account, gateway_code)?;
    // The followers have had the summary: their streams end, and the API with them. A write
    // of the stream's last lines that failed (a full disk) fails the run, once the checkpoint
    // is written.
    let ended = run.output().end_followers();
    servers.close().await;
    // After the summary: a checkpoint that cannot be written does not cost the audit's end.
    if let Some(checkpoints) = checkpoints.as_mut() {
        // It keeps the JIT hosts' children's frames: those of copies still being unwound too.
        run.settle_copies()?;
        checkpoints.write(&mut run)?;
    }
    ended?;
    Ok(status)
}

/// Makes the pid of each rewritten pidfile a gateway (with what it already spawned, from
/// /proc). A pidfile that names no live process, or holds no pid, is reported and waited on.
pub(super) fn follow_pidfiles(
    selectors: &mut Selectors,
    run: &mut Pipeline,
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
                let note = format!("{label}: {e:#}; waiting for it to change");
                run.output().note(&note)?;
                continue;
            }
        };
        adopt(&[(selector, stat)], &[], tracked, run)?;
    }
    Ok(())
}

/// Tracks gateways found in /proc (with the selector that found each) and what they and
/// `roots` (processes already tracked) spawned, and announces each gateway. Returns the pids
/// of those that exited meanwhile.
fn adopt(
    gateways: &[(usize, Stat)],
    roots: &[u32],
    tracked: &mut TrackedMap,
    run: &mut Pipeline,
) -> Result<Vec<u32>> {
    let stats: Vec<Stat> = gateways.iter().map(|(_, s)| s.clone()).collect();
    let seeds = seed::seed(tracked, &stats, roots)?;
    run.add_seeds(seeds)?;
    let mut gone = Vec::new();
    for (selector, stat) in gateways {
        if !run.announce_found(stat.pid, stat.start_ticks, *selector)? {
            gone.push(stat.pid);
        }
    }
    Ok(gone)
}
