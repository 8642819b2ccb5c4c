//! The package's unit as systemd starts it: the root the package was installed into, booted
//! with systemd as its init on Debian's kernel of the root's architecture (qemu-system,
//! emulated), with the unit enabled as `systemctl enable` does. A check that systemd runs
//! after the unit (`unit-check.sh`) says on the console whether the run came up under the
//! unit's sandbox and capabilities: running and never restarted, its `ready` line in the
//! audit, the setsid hook it got, its capabilities once attached, an answer over its API.
use std::{
    io::{BufRead, BufReader},
    process::Stdio,
    sync::mpsc,
};

use super::*;

/// The unit's check, run by systemd once `reaper-trace.service` has started.
const CHECK: &str = include_str!("unit-check.sh");
const CHECK_UNIT: &str = "[Unit]\n\
    Description=Says on the console how reaper-trace.service fared\n\
    After=reaper-trace.service\n\
    [Service]\n\
    Type=oneshot\n\
    ExecStart=/usr/local/sbin/reaper-unit-check\n\
    [Install]\n\
    WantedBy=multi-user.target\n";
/// What the check's lines start with.
const SAID: &str = "reaper-unit-check: ";

/// Boots `root` (a Debian root of `arch` with the package installed; `in_root` runs a
/// program in it) with systemd as its init on the kernel `kernel_variable` names, and
/// asserts that the package's unit started reaper-trace as it should. The boot is capped
/// far past a slow emulated one; on a failure, what the check and the console said.
pub fn assert_unit_starts_under_systemd(
    test: &str,
    root: &Path,
    arch: &str,
    in_root: impl Fn(&[&str]) -> Output,
    kernel_variable: &str,
) {
    let Some(kernel) = made_by_this_run(test, kernel_variable) else {
        return;
    };
    let enabled = in_root(&["systemctl", "enable", "reaper-trace"]);
    assert!(enabled.status.success(), "{}", said(&enabled));
    let check = root.join("usr/local/sbin/reaper-unit-check");
    std::fs::write(&check, CHECK).unwrap();
    std::fs::set_permissions(&check, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(
        root.join("etc/systemd/system/reaper-unit-check.service"),
        CHECK_UNIT,
    )
    .unwrap();
    let enabled = in_root(&["systemctl", "enable", "reaper-unit-check"]);
    assert!(enabled.status.success(), "{}", said(&enabled));
    let initrd = root.with_extension("cpio");
    let packed = Command::new("sh")
        .arg("-c")
        .arg("cd \"$1\" && find . | cpio -o -H newc --quiet > \"$2\"")
        .args(["pack", root.to_str().unwrap(), initrd.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(packed.status.success(), "cpio: {}", said(&packed));
    let booted = boot(arch, &kernel, &initrd);
    let _ = std::fs::remove_file(&initrd);
    let console = &booted.console;
    let said: Vec<&str> = console
        .iter()
        .filter_map(|l| l.split_once(SAID).map(|(_, said)| said))
        .collect();
    let shown = || {
        let tail = console.len().saturating_sub(60);
        format!(
            "the guest ran {:.0} s and {}; the check said:\n{}\nthe console's last lines:\n{}",
            booted.secs,
            booted.ended,
            said.join("\n"),
            console[tail..].join("\n")
        )
    };
    assert!(said.contains(&"end"), "the check never ended: {}", shown());
    eprintln!(
        "{test} ({arch}): the guest ran {:.0} s; the check said:\n{}",
        booted.secs,
        said.join("\n")
    );
    let line = |what: &str| {
        said.iter()
            .find_map(|l| l.strip_prefix(what))
            .unwrap_or_else(|| panic!("no `{what}` line; {}", shown()))
    };
    assert_eq!(line("unit: "), "active running restarts=0", "{}", shown());
    // The tracepoint where the kernel opens it for the unit's capabilities; on a kernel whose
    // perf_event_paranoid is 3 or more (Debian's), the raw syscalls, the note saying why.
    let paranoid: i32 = line("perf_event_paranoid: ").parse().expect("a level");
    let hook = line("ready: ");
    match paranoid >= 3 {
        true => {
            assert_eq!(hook, r#""setsid_hook":"raw_syscalls""#, "{}", shown());
            assert!(
                said.iter().any(|l| l.contains(&format!(
                    "perf_event_paranoid is {paranoid} here: the kernel opens it for \
                     CAP_SYS_ADMIN alone"
                ))),
                "{}",
                shown()
            );
        }
        false => assert_eq!(hook, r#""setsid_hook":"tracepoint""#, "{}", shown()),
    }
    // Attached, it keeps CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH alone, with no_new_privs.
    assert_eq!(line("CapPrm: "), "0000000000080004", "{}", shown());
    assert_eq!(line("CapEff: "), "0000000000080004", "{}", shown());
    assert_eq!(line("NoNewPrivs: "), "1", "{}", shown());
    // Answered by the unit's run, over its API: the check's shell is no gateway's.
    assert!(
        line("why: ")
            .contains("not a descendant of any gateway traced by /run/reaper-trace/api.sock"),
        "{}",
        shown()
    );
}

/// A guest's run: its console, how long it ran and how it ended.
struct Booted {
    console: Vec<String>,
    secs: f64,
    ended: String,
}

/// The console of a guest of `arch` booting `kernel` with `initrd` as its root and systemd as
/// its init, until the check's last line (it powers off then), qemu's exit, or a cap far past
/// a slow boot and the check's own 600 s cap. Killed with the test, however it ends.
fn boot(arch: &str, kernel: &Path, initrd: &Path) -> Booted {
    let (qemu, machine, console): (&str, &[&str], &str) = match arch {
        "aarch64" => (
            "qemu-system-aarch64",
            &["-M", "virt", "-cpu", "max,pauth-impdef=on"],
            "ttyAMA0",
        ),
        _ => ("qemu-system-x86_64", &["-cpu", "max"], "ttyS0"),
    };
    let mut guest = Command::new(qemu);
    guest
        .args(machine)
        .args([
            "-m",
            "2048",
            "-smp",
            "2",
            "-nographic",
            "-no-reboot",
            "-nic",
            "none",
        ])
        // One host thread: the host's tests run two at a time on two cores.
        .args(["-accel", "tcg,thread=single"])
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        // `quiet`: the kernel's messages would share the console with the check's lines.
        .arg(format!(
            "console={console} rdinit=/sbin/init panic=-1 quiet loglevel=3 \
             systemd.show_status=0"
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    // SAFETY: only prctl between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut guest, || {
            match libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
    let started = Instant::now();
    let mut guest = guest.spawn().unwrap_or_else(|e| panic!("{qemu}: {e}"));
    let (lines, seen) = mpsc::channel();
    let stdout = guest.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).split(b'\n').map_while(Result::ok) {
            let line = String::from_utf8_lossy(&line);
            if lines.send(line.trim_end_matches('\r').to_owned()).is_err() {
                break;
            }
        }
    });
    let deadline = started + Duration::from_secs(1500);
    let mut console = Vec::new();
    let ended = loop {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            break "was stopped at its 1,500 s cap".to_owned();
        };
        match seen.recv_timeout(left) {
            Ok(line) => {
                let last = line.contains(&format!("{SAID}end"));
                console.push(line);
                if last {
                    break "its check ended".to_owned();
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                break format!("qemu ended ({:?})", guest.wait().map(|s| s.to_string()));
            }
        }
    };
    let _ = guest.kill();
    let _ = guest.wait();
    Booted {
        console,
        secs: started.elapsed().as_secs_f64(),
        ended,
    }
}
