//! Loads the embedded eBPF object with this kernel's offsets, attaches the probes, and hands
//! out the maps user space needs, as parts for their owners. Dropping [`Probes::attached`]
//! detaches everything.
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, RawTracePoint, TracePoint, links::FdLink},
};
use reaper_common::copy::COPY_MAX;
use reaper_common::{
    ExeKey, KernelOffsets, PathKey, ProbeConfig, ReaderMark, SPAWN_STACKS_COPY, Tracked, names,
};

use crate::capture::btf::KernelBtf;
use crate::capture::features::{self, KernelFeatures};
use crate::capture::pins::{self, PinDir};
pub use crate::capture::shared::{
    Accounting, KernelCounters, LossCounts, ReaderIdle, ReaderMarks, StackMaps, TakeOver,
};
use crate::capture::sizes::MapSizes;
use crate::capture::tracefs;
use crate::procfs::boottime_now;

/// The smallest ring that stacks are copied into: room for 16 of the largest copies.
const COPY_RING_MIN: u32 = 16 * COPY_MAX as u32;

/// The eBPF object built by build.rs.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/reaper"));

/// The lifecycle tracepoints, attached as BTF tracepoints (no tracefs needed).
const LIFECYCLE: [&str; 4] = [
    "sched_process_fork",
    "sched_process_exec",
    "sched_process_exit",
    "sched_process_free",
];

/// The cgroup tracepoints, attached only when cgroups are selected.
const CGROUP_SELECTION: [&str; 3] = ["cgroup_attach_task", "cgroup_mkdir", "cgroup_rmdir"];

/// Which gateway selectors the kernel programs look for (load-time switches: with none, the
/// untracked paths cost what they cost without selectors).
#[derive(Clone, Copy, Debug, Default)]
pub struct SelectorNeeds {
    /// Executables by inode.
    pub exes: bool,
    /// Scripts by the path they are executed by.
    pub paths: bool,
    /// cgroups.
    pub cgroups: bool,
}

/// The kernel's gateway-selector maps, filled by [`crate::gateways::Selectors::arm`].
pub struct SelectorMaps {
    pub exes: HashMap<MapData, ExeKey, u32>,
    pub paths: HashMap<MapData, PathKey, u32>,
    pub cgroups: HashMap<MapData, u64, u32>,
    pub cgroup_paths: HashMap<MapData, PathKey, u32>,
}

/// Load-time settings.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Capacity of the in-kernel tracked-process map.
    pub max_tracked: u32,
    /// Ring buffer size in bytes (a power of two, at least a page).
    pub ring_bytes: u32,
    /// How often the reader polls the ring while events stream (`--wakeup-interval`), its
    /// wake-ups batched meanwhile; zero: the kernel's default, a wake-up per record.
    pub wakeup_interval: Duration,
    /// The setsid hook to use; `None`: the best one this host offers.
    pub setsid_hook: Option<SetsidHook>,
    pub selectors: SelectorNeeds,
    /// `--state-dir`: the kernel side pinned, and taken over from the run before.
    pub kept: Option<Kept>,
    /// What to take of tracked spawners' stacks at fork (`--spawn-stacks`): the
    /// `SPAWN_STACKS_*` bits of `reaper_common`.
    pub spawn_stacks: u64,
}

/// The kernel side of a state (`--state-dir`).
#[derive(Clone, Debug)]
pub struct Kept {
    pub pins: PinDir,
    /// `--state-keep`: how long the probes record with no reader draining the ring.
    pub keep: Duration,
    /// What the run before told its probes, when its kernel side is taken over (see
    /// `state::take`); none for a first run.
    pub previous: Option<ReaderMark>,
}

/// How setsid() calls are observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetsidHook {
    /// The `syscalls/sys_exit_setsid` tracepoint.
    Tracepoint,
    /// The raw `sys_exit` tracepoint, filtered in the kernel by syscall number.
    RawSyscalls,
    /// Not observed: a session change shows only in the sid of later forks.
    None,
}

impl SetsidHook {
    pub fn name(self) -> &'static str {
        match self {
            SetsidHook::Tracepoint => "tracepoint",
            SetsidHook::RawSyscalls => "raw_syscalls",
            SetsidHook::None => "none",
        }
    }
}

/// The loaded, attached probes, as the parts a run hands each of its owners whole: the
/// attachment (to drop at the stop), the ring and the maps the event loop reads, the
/// selectors' maps, the stacks' maps (for the spawn sites), and what the load found.
pub struct Probes {
    pub attached: Attached,
    pub ring: RingBuf<MapData>,
    pub kernel: KernelMaps,
    pub selector_maps: SelectorMaps,
    /// Spawners' stacks and the interpreters they are read from (for the run's
    /// [`crate::sites::SpawnSites`]).
    pub stacks: StackMaps,
    pub facts: LoadFacts,
}

/// The programs and their links: dropping this detaches every probe (the maps stay, for the
/// last drain).
pub struct Attached {
    _ebpf: Ebpf,
}

/// The maps the event loop reads and writes besides the ring.
pub struct KernelMaps {
    pub counters: KernelCounters,
    pub tracked: HashMap<MapData, u32, Tracked>,
    /// The reader's "I went idle, wake me" flag (see `submit_flags` in the probes).
    pub reader_idle: ReaderIdle,
    /// What the reader tells the probes: their generation, its records taken, `--state-keep`.
    pub marks: ReaderMarks,
}

/// What a load found.
pub struct LoadFacts {
    /// This load's generation (see `ReaderMark::generation`).
    pub generation: u64,
    /// The pinned state this load took over, as the run before left it: it attached its
    /// programs before detaching that run's.
    pub took_over: Option<TakeOver>,
    pub setsid_hook: SetsidHook,
    /// What the kernel offers.
    pub features: KernelFeatures,
    /// Things worth telling the user (tracefs mounted, a hook degraded).
    pub notes: Vec<String>,
}

/// This kernel's offsets, checked against the tracepoints the probes need. The BTF bytes are
/// dropped and handed back before aya parses its own copy.
fn resolve_offsets(cgroups: bool) -> Result<KernelOffsets> {
    let offsets = {
        let kernel_btf = KernelBtf::from_sys_fs()?;
        let cgroup_tps = CGROUP_SELECTION.iter().filter(|_| cgroups);
        for &tp in LIFECYCLE.iter().chain(cgroup_tps) {
            if !kernel_btf.has_btf_tracepoint(tp)? {
                return Err(anyhow!(
                    "this kernel has no BTF tracepoint `{tp}` (needs Linux 5.5+)"
                ));
            }
        }
        kernel_btf.kernel_offsets()?
    };
    release_free_heap();
    Ok(offsets)
}

/// The attached programs' links: left in the object (dropping it detaches them), or, for a
/// kept state, taken out and pinned (they stay attached when this process exits).
struct Links<'a> {
    pin: Option<(&'a PinDir, u64)>,
}

impl Links<'_> {
    /// Pins the link `take` hands out, for a kept state; otherwise leaves it in the object
    /// (taking it out would detach it when dropped).
    fn keep<L>(&self, program: &str, take: impl FnOnce() -> Result<L>) -> Result<()>
    where
        L: TryInto<FdLink, Error: std::fmt::Display>,
    {
        let Some((pins, generation)) = self.pin else {
            return Ok(());
        };
        let link = take()?
            .try_into()
            .map_err(|e| anyhow!("the link of {program} cannot be pinned: {e}"))?;
        pins::pin_link(link, &pins.link(generation, program))
    }
}

/// Loads and attaches the BTF tracepoint programs. aya's parsed kernel BTF (~20 MiB) lives only
/// for this, and is handed back before the ring buffer is mapped.
fn attach_lifecycle(ebpf: &mut Ebpf, cgroups: bool, links: &Links) -> Result<()> {
    {
        let btf = Btf::from_sys_fs().context("reading the kernel BTF")?;
        let cgroup_tps = CGROUP_SELECTION.iter().filter(|_| cgroups);
        for &tp in LIFECYCLE.iter().chain(cgroup_tps) {
            let prog: &mut BtfTracePoint = ebpf
                .program_mut(tp)
                .ok_or_else(|| anyhow!("program {tp} missing from the object"))?
                .try_into()?;
            prog.load(tp, &btf)
                .with_context(|| format!("loading {tp}"))?;
            let id = prog.attach().with_context(|| format!("attaching {tp}"))?;
            links.keep(tp, || Ok(prog.take_link(id)?))?;
        }
    }
    release_free_heap();
    Ok(())
}

/// Returns freed heap pages to the system (glibc keeps them otherwise).
fn release_free_heap() {
    // SAFETY: malloc_trim only releases memory that is already free.
    unsafe { libc::malloc_trim(0) };
}

/// Explains a load or attach failure in terms of what to do about it.
fn failure_hint(err: &anyhow::Error) -> String {
    let text = format!("{err:#}");
    let release = crate::procfs::kernel_release();
    if features::too_old(&release) {
        format!(
            "\nthis kernel ({}) is older than 5.12 and its BPF verifier refuses the probes: {}",
            release,
            features::NEEDS_NEWER
        )
    } else if text.contains("BPF_ATOMIC") || text.contains("unknown opcode") {
        format!(
            "\nthis kernel's BPF verifier lacks the atomic instructions the probes use: {}",
            features::NEEDS_NEWER
        )
    } else if text.contains("Operation not permitted")
        || text.contains("EPERM")
        || text.contains("permission")
    {
        "\nreaper-trace needs root, or CAP_BPF + CAP_PERFMON (and CAP_SYS_ADMIN to \
         mount tracefs): run it as root, e.g. `sudo reaper-trace ...`"
            .to_owned()
    } else {
        String::new()
    }
}

impl Probes {
    /// Loads and attaches everything.
    pub fn load(opts: &LoadOptions) -> Result<Probes> {
        Self::try_load(opts).map_err(|e| {
            // A first run of a kept state that fails leaves nothing pinned.
            if let Some(kept @ Kept { previous: None, .. }) = &opts.kept {
                let _ = kept.pins.release();
            }
            let hint = failure_hint(&e);
            e.context(format!("loading the eBPF probes failed{hint}"))
        })
    }

    fn try_load(opts: &LoadOptions) -> Result<Probes> {
        let features = KernelFeatures::probe();
        features.require()?;
        let offsets = resolve_offsets(opts.selectors.cgroups)?;
        let mut notes = Vec::new();

        // The classic setsid tracepoint needs its record layout before the object is loaded.
        let tracefs = tracefs::find_or_mount();
        let setsid_ret_offset = match &tracefs {
            Ok(fs) => {
                if fs.mounted_by_us {
                    notes.push(format!(
                        "mounted tracefs at {} (left mounted)",
                        fs.root.display()
                    ));
                }
                fs.field_offset("syscalls", "sys_exit_setsid", "ret").ok()
            }
            Err(e) => {
                notes.push(format!("{e:#}"));
                None
            }
        };
        // A kept state: the run before's programs record until this load's are attached.
        let previous = match &opts.kept {
            Some(kept) => {
                notes.extend(kept.pins.create()?);
                kept.previous
            }
            None => None,
        };
        let generation = previous.map_or(1, |m| m.generation + 1);
        // A kept state's maps keep the sizes they were made with.
        let mut sizes = MapSizes::asked(opts);
        if let Some(kept) = &opts.kept {
            notes.extend(sizes.keep_pinned(&kept.pins)?);
        }
        // A stack copy is a record of up to 16 KiB: a ring that cannot hold many of them
        // would lose them, and every record behind them, whenever the reader lags.
        let mut spawn_stacks = opts.spawn_stacks;
        if spawn_stacks & SPAWN_STACKS_COPY != 0 && sizes.ring_bytes < COPY_RING_MIN {
            spawn_stacks &= !SPAWN_STACKS_COPY;
            notes.push(format!(
                "--ring-size {} KiB is under {} KiB: no spawner's stack is copied (native \
                 spawners and Node hosts get their frame-pointer walk only)",
                sizes.ring_bytes / 1024,
                COPY_RING_MIN / 1024
            ));
        }
        let config = ProbeConfig {
            wakeup_interval: u64::try_from(opts.wakeup_interval.as_nanos()).unwrap_or(u64::MAX),
            // Wake at once when a quarter of the ring is waiting, long before it can fill.
            wakeup_bytes: u64::from(sizes.ring_bytes / 4),
            setsid_ret_offset: setsid_ret_offset.unwrap_or(0),
            setsid_nr: libc::SYS_setsid as u64,
            gateway_exes: u64::from(opts.selectors.exes),
            gateway_paths: u64::from(opts.selectors.paths),
            gateway_cgroups: u64::from(opts.selectors.cgroups),
            generation,
            spawn_stacks,
        };

        // The loader's own copy of the kernel BTF is only for CO-RE relocations, which this
        // object has none of: drop it, so no two parsed copies are ever resident together.
        let mut loader = EbpfLoader::new();
        loader
            .btf(None)
            .override_global(names::OFFSETS, &offsets, true)
            .override_global(names::CONFIG, &config, true)
            .map_max_entries(names::TRACKED, sizes.tracked)
            .map_max_entries(names::EVENTS, sizes.ring_bytes)
            .map_max_entries(names::STACKS, sizes.stacks)
            .map_max_entries(names::PY_STACKS, sizes.py_stacks);
        // A kept state's maps are pinned, or taken from their pins as the run before left
        // them (its sizes, its records).
        if let Some(kept) = &opts.kept {
            for name in names::PINNED {
                loader.map_pin_path(name, kept.pins.map(name));
            }
        }
        let mut ebpf = loader
            .load(EBPF_OBJECT)
            .context("loading the eBPF object")?;
        crate::resident::drop_read_once(EBPF_OBJECT);
        let map = |ebpf: &mut Ebpf, name: &str| {
            ebpf.take_map(name)
                .ok_or_else(|| anyhow!("map {name} missing from the object"))
        };
        let mut marks = ReaderMarks {
            map: Array::try_from(map(&mut ebpf, names::READER)?)?,
            mark: previous.unwrap_or_default(),
            keep: opts.kept.as_ref().map(|k| k.keep),
        };
        if previous.is_none() {
            // Nothing records yet: this load's programs do from their first event.
            marks.mark.generation = generation;
            marks.write()?;
        }

        let links = Links {
            pin: opts.kept.as_ref().map(|k| (&k.pins, generation)),
        };
        let attaching = boottime_now();
        attach_lifecycle(&mut ebpf, opts.selectors.cgroups, &links)?;
        let setsid_hook = attach_setsid(
            &mut ebpf,
            setsid_ret_offset.is_some(),
            opts.setsid_hook,
            &links,
            &mut notes,
        );
        let took_over = match (&opts.kept, previous) {
            (Some(kept), Some(before)) => {
                // Every event now runs both generations' programs; from the switch on, this
                // one's record. Then the run before's programs go.
                marks.mark.generation = generation;
                marks.write()?;
                kept.pins.detach_others(generation)?;
                Some(TakeOver {
                    before,
                    overlap: (attaching, boottime_now()),
                })
            }
            _ => None,
        };

        Ok(Probes {
            ring: RingBuf::try_from(map(&mut ebpf, names::EVENTS)?)?,
            kernel: KernelMaps {
                counters: KernelCounters {
                    losses: PerCpuArray::try_from(map(&mut ebpf, names::LOSSES)?)?,
                    seq: Array::try_from(map(&mut ebpf, names::SEQ)?)?,
                },
                tracked: HashMap::try_from(map(&mut ebpf, names::TRACKED)?)?,
                reader_idle: ReaderIdle(Array::try_from(map(&mut ebpf, names::READER_IDLE)?)?),
                marks,
            },
            selector_maps: SelectorMaps {
                exes: HashMap::try_from(map(&mut ebpf, names::GATEWAY_EXES)?)?,
                paths: HashMap::try_from(map(&mut ebpf, names::GATEWAY_PATHS)?)?,
                cgroups: HashMap::try_from(map(&mut ebpf, names::GATEWAY_CGROUPS)?)?,
                cgroup_paths: HashMap::try_from(map(&mut ebpf, names::GATEWAY_CGROUP_PATHS)?)?,
            },
            stacks: StackMaps {
                native: HashMap::try_from(map(&mut ebpf, names::STACKS)?)?,
                interpreters: HashMap::try_from(map(&mut ebpf, names::PYTHONS)?)?,
                python: HashMap::try_from(map(&mut ebpf, names::PY_STACKS)?)?,
                binaries: HashMap::try_from(map(&mut ebpf, names::PY_BINARIES)?)?,
                jit_hosts: HashMap::try_from(map(&mut ebpf, names::JIT_HOSTS)?)?,
            },
            facts: LoadFacts {
                generation,
                took_over,
                setsid_hook,
                features,
                notes,
            },
            attached: Attached { _ebpf: ebpf },
        })
    }
}

/// Why a syscall's tracepoint was refused, when the kernel's setting says it: with a
/// `perf_event_paranoid` of 3 or more (Debian's kernels: 3), perf events open for
/// CAP_SYS_ADMIN alone, whatever CAP_PERFMON says (EACCES).
fn refused_by_paranoia(e: &anyhow::Error) -> String {
    let denied = e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.raw_os_error() == Some(libc::EACCES))
    });
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|level| level.trim().parse::<i32>().ok());
    match (denied, paranoid) {
        (true, Some(level)) if level >= 3 => format!(
            " (perf_event_paranoid is {level} here: the kernel opens it for CAP_SYS_ADMIN alone)"
        ),
        _ => String::new(),
    }
}

/// Attaches the wanted setsid hook, or the best available one, degrading with a note.
fn attach_setsid(
    ebpf: &mut Ebpf,
    have_format: bool,
    want: Option<SetsidHook>,
    links: &Links,
    notes: &mut Vec<String>,
) -> SetsidHook {
    if want == Some(SetsidHook::None) {
        notes.push("setsid() is not observed (--setsid-hook none)".into());
        return SetsidHook::None;
    }
    if have_format && want != Some(SetsidHook::RawSyscalls) {
        let attached = (|| -> Result<()> {
            let prog: &mut TracePoint = ebpf
                .program_mut("sys_exit_setsid")
                .ok_or_else(|| anyhow!("program sys_exit_setsid missing"))?
                .try_into()?;
            prog.load()?;
            let id = prog.attach("syscalls", "sys_exit_setsid")?;
            links.keep("sys_exit_setsid", || Ok(prog.take_link(id)?))?;
            Ok(())
        })();
        match attached {
            Ok(()) => return SetsidHook::Tracepoint,
            Err(e) => notes.push(format!(
                "syscalls/sys_exit_setsid unavailable: {e:#}{}",
                refused_by_paranoia(&e)
            )),
        }
    }
    let attached = (|| -> Result<()> {
        let prog: &mut RawTracePoint = ebpf
            .program_mut("raw_sys_exit")
            .ok_or_else(|| anyhow!("program raw_sys_exit missing"))?
            .try_into()?;
        prog.load()?;
        let id = prog.attach("sys_exit")?;
        links.keep("raw_sys_exit", || Ok(prog.take_link(id)?))?;
        Ok(())
    })();
    match attached {
        Ok(()) => {
            notes.push(
                "setsid() is observed through the raw sys_exit tracepoint (filtered in the kernel)"
                    .into(),
            );
            SetsidHook::RawSyscalls
        }
        Err(e) => {
            notes.push(format!(
                "setsid() cannot be observed as it happens ({e:#}); a session change shows in the \
                 sid of later fork events"
            ));
            SetsidHook::None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loader asks for maps by the names in `reaper_common::names`; the kernel side names
    /// its statics the same way. A rename on one side fails here, not at load. (The globals
    /// are overridden with `must_exist`, so a missing one fails the load by its name.)
    #[test]
    fn the_object_holds_every_name_the_loader_asks_for() {
        let object = aya_obj::Object::parse(EBPF_OBJECT).expect("the embedded object parses");
        let named: Vec<&str> = names::PINNED
            .iter()
            .chain(&names::SCRATCH)
            .copied()
            .collect();
        for name in &named {
            assert!(object.maps.contains_key(*name), "map {name} in the object");
        }
        // And every map is either kept with a state or a load's own scratch space.
        for name in object.maps.keys().filter(|n| !n.starts_with('.')) {
            assert!(
                named.contains(&name.as_str()),
                "map {name} neither pinned nor scratch"
            );
        }
    }
}
