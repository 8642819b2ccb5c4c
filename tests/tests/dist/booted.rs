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
    let console = boot(arch, &kernel, &initrd);
    let said: Vec<&str> = console
        .iter()
        .filter_map(|l| l.split_once(SAID).map(|(_, said)| said))
        .collect();
    let shown = || {
        let tail = console.len().saturating_sub(60);
        format!(
            "the check said:\n{}\nthe console's last lines:\n{}",
            said.join("\n"),
            console[tail..].join("\n")
        )
    };
    assert!(said.contains(&"end"), "the check never ended; {}", shown());
    eprintln!("{test} ({arch}): the check said:\n{}", said.join("\n"));
    let line = |what: &str| {
        said.iter()
            .find_map(|l| l.strip_prefix(what))
            .unwrap_or_else(|| panic!("no `{what}` line; {}", shown()))
    };
    assert_eq!(line("unit: "), "active running restarts=0", "{}", shown());
    // Whichever the kernel allows the unit's capabilities (see the unit's comment), never none.
    let hook = line("ready: ");
    assert!(
        hook == r#""setsid_hook":"tracepoint""# || hook == r#""setsid_hook":"raw_syscalls""#,
        "{}",
        shown()
    );
    // Attached, it keeps CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH alone, with no_new_privs.
    assert_eq!(
        line("capabilities: "),
        "CapPrm: 0000000000080004 CapEff: 0000000000080004 NoNewPrivs: 1 ",
        "{}",
        shown()
    );
    assert!(
        line("why: ").contains("/run/reaper-trace/api.sock"),
        "{}",
        shown()
    );
}

/// The console of a guest of `arch` booting `kernel` with `initrd` as its root and systemd as
/// its init, until it powers off (the check's last step) or a cap far past a slow boot.
fn boot(arch: &str, kernel: &Path, initrd: &Path) -> Vec<String> {
    let (qemu, machine, console): (&str, &[&str], &str) = match arch {
        "aarch64" => (
            "qemu-system-aarch64",
            &["-M", "virt", "-cpu", "max,pauth-impdef=on"],
            "ttyAMA0",
        ),
        _ => ("qemu-system-x86_64", &["-cpu", "max"], "ttyS0"),
    };
    let mut guest = Command::new(qemu)
        .args(machine)
        .args(["-m", "2048", "-smp", "2", "-nographic", "-no-reboot"])
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        .arg(format!(
            "console={console} rdinit=/sbin/init panic=-1 systemd.show_status=0"
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("{qemu}: {e}"));
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
    // Booting systemd emulated takes a minute or two; the cap is for a guest that hangs.
    let deadline = Instant::now() + Duration::from_secs(1200);
    let mut console = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match seen.recv_timeout(left) {
            Ok(line) => {
                let ended = line.contains(&format!("{SAID}end"));
                console.push(line);
                if ended {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    let _ = guest.kill();
    let _ = guest.wait();
    console
}
