//! Where a process lives: its pid inside its own pid namespace, its cgroup v2 path, and the
//! container that path names. Every pid reaper-trace reports is the initial namespace's (the
//! kernel's); these say how the process sees itself and which container it is in.
use serde::{Deserialize, Serialize};

/// A process's pid namespace and cgroup, as /proc shows them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Placement {
    /// Its pid inside its own pid namespace, when that differs from the host's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nspid: Option<u32>,
    /// Its cgroup v2 path (`/system.slice/hermes.service`); null on a host without cgroup v2.
    pub cgroup: Option<String>,
    /// The container its cgroup names, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<Container>,
}

/// A container, as its cgroup path names it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Container {
    /// `docker`, `containerd`, `cri-o`, `podman` or `systemd-nspawn`.
    pub runtime: String,
    /// The container id (64 hex digits), or the machine name for systemd-nspawn.
    pub id: String,
    /// The Kubernetes pod's uid, for a container under `kubepods`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
}

/// Reads the placement of `pid` (what cannot be read stays empty).
pub fn read(pid: u32) -> Placement {
    let nspid = super::read_text(pid, "status")
        .ok()
        .and_then(|t| parse_nspid(&t))
        .filter(|&inner| inner != pid);
    let cgroup = super::read_text(pid, "cgroup")
        .ok()
        .and_then(|t| parse_cgroup(&t));
    let container = cgroup.as_deref().and_then(container_of);
    Placement {
        nspid,
        cgroup,
        container,
    }
}

/// Whether `pid` lives in a pid namespace below the initial one (its `NSpid:` line names
/// more than one pid): its thread ids there are not the kernel's.
pub fn in_child_pid_namespace(pid: u32) -> bool {
    super::read_text(pid, "status")
        .ok()
        .and_then(|t| nspids(&t).map(|mut ids| ids.nth(1).is_some()))
        .unwrap_or(false)
}

/// The innermost pid of the `NSpid:` line of `/proc/PID/status` (host pid first, then one per
/// nested namespace).
pub fn parse_nspid(status: &str) -> Option<u32> {
    nspids(status)?.last()?.parse().ok()
}

/// The pids of the `NSpid:` line, outermost first.
fn nspids(status: &str) -> Option<std::str::SplitAsciiWhitespace<'_>> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    Some(line.split_ascii_whitespace())
}

/// The cgroup v2 path in `/proc/PID/cgroup` (the `0::PATH` line), as text.
pub fn parse_cgroup(text: &str) -> Option<String> {
    let path = cgroup_path(text.as_bytes())?;
    Some(String::from_utf8_lossy(path).into_owned())
}

/// The cgroup v2 path in `/proc/PID/cgroup`'s bytes, exact: a cgroup's name need not be
/// UTF-8 (the kernel refuses a newline in one, so a line is a whole path).
pub fn cgroup_path(bytes: &[u8]) -> Option<&[u8]> {
    bytes
        .split(|&b| b == b'\n')
        .find_map(|l| l.strip_prefix(b"0::"))
}

/// The container a cgroup path names: the runtimes' own naming conventions (cgroupfs and
/// systemd drivers alike). (`machine-NAME.scope` is not taken for a container: systemd-machined
/// names virtual machines so too.)
pub fn container_of(path: &str) -> Option<Container> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let pod_uid = parts.iter().find_map(|p| pod_uid(p));
    // From the innermost component out: a container's own directory is the deepest one.
    for part in parts.iter().rev() {
        let unit = part
            .strip_suffix(".scope")
            .or_else(|| part.strip_suffix(".service"))
            .unwrap_or(part);
        let id_after = |prefix: &str| unit.strip_prefix(prefix).filter(|id| is_id(id));
        let found = if let Some(id) = id_after("docker-") {
            Some(("docker", id))
        } else if let Some(id) = id_after("cri-containerd-") {
            Some(("containerd", id))
        } else if let Some(id) = id_after("crio-") {
            Some(("cri-o", id))
        } else if let Some(id) = id_after("libpod-") {
            Some(("podman", id))
        } else if let Some(name) = unit.strip_prefix("systemd-nspawn@") {
            Some(("systemd-nspawn", name))
        } else if is_id(unit) {
            // cgroupfs driver: /docker/ID, /kubepods/.../podUID/ID, /libpod_parent/libpod-ID.
            let parent = parts.iter().rev().nth(1).copied().unwrap_or_default();
            let runtime = match parent {
                "docker" => "docker",
                _ if pod_uid.is_some() => "containerd",
                _ => continue,
            };
            Some((runtime, unit))
        } else {
            None
        };
        if let Some((runtime, id)) = found {
            return Some(Container {
                runtime: runtime.into(),
                id: id.into(),
                pod_uid: pod_uid.clone().filter(|_| runtime != "systemd-nspawn"),
            });
        }
    }
    None
}

/// A container id: 64 lowercase hex digits.
fn is_id(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// The pod uid in a kubepods component: `pod<uid>` (cgroupfs) or
/// `kubepods-burstable-pod<uid with _ for ->.slice` (systemd).
fn pod_uid(part: &str) -> Option<String> {
    let part = part.strip_suffix(".slice").unwrap_or(part);
    let at = part.rfind("pod")?;
    if !(at == 0 || part[..at].ends_with('-')) {
        return None;
    }
    let uid = part[at + 3..].replace('_', "-");
    let uuid_like = uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    uuid_like.then_some(uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const POD: &str = "6f1c1a52-1111-4c2e-9a5b-0123456789ab";

    fn container(path: &str) -> Option<(String, String, Option<String>)> {
        container_of(path).map(|c| (c.runtime, c.id, c.pod_uid))
    }

    #[test]
    fn namespaced_pids_and_cgroups() {
        let status = "Name:\tsh\nTgid:\t4711\nNSpid:\t4711\t2\nPPid:\t4700\n";
        assert_eq!(parse_nspid(status), Some(2));
        assert_eq!(parse_nspid("NSpid:\t4711\n"), Some(4711));
        assert_eq!(parse_nspid("Name:\tx\n"), None, "kernels before 4.1");
        assert_eq!(
            parse_cgroup("0::/system.slice/hermes.service\n").as_deref(),
            Some("/system.slice/hermes.service")
        );
        assert_eq!(
            parse_cgroup("12:pids:/x\n1:name=systemd:/x\n"),
            None,
            "cgroup v1 only"
        );
    }

    #[test]
    fn containers_by_their_runtimes_cgroup_names() {
        let d = |r: &str| Some((r.to_owned(), ID.to_owned(), None));
        assert_eq!(container(&format!("/docker/{ID}")), d("docker"));
        assert_eq!(
            container(&format!("/system.slice/docker-{ID}.scope")),
            d("docker")
        );
        assert_eq!(
            container(&format!("/machine.slice/libpod-{ID}.scope/container")),
            d("podman")
        );
        assert_eq!(
            container(&format!(
                "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope"
            )),
            d("podman")
        );
        let k = |r: &str| Some((r.to_owned(), ID.to_owned(), Some(POD.to_owned())));
        let systemd_pod = POD.replace('-', "_");
        assert_eq!(
            container(&format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{systemd_pod}.slice/cri-containerd-{ID}.scope"
            )),
            k("containerd")
        );
        assert_eq!(
            container(&format!("/kubepods/besteffort/pod{POD}/{ID}")),
            k("containerd")
        );
        assert_eq!(
            container(&format!(
                "/kubepods.slice/kubepods-pod{systemd_pod}.slice/crio-{ID}.scope"
            )),
            k("cri-o")
        );
        assert_eq!(
            container("/machine.slice/systemd-nspawn@web.service/payload"),
            Some(("systemd-nspawn".into(), "web".into(), None))
        );
        assert_eq!(container("/system.slice/hermes.service"), None);
        assert_eq!(container("/user.slice/user-0.slice/session-3.scope"), None);
        assert_eq!(
            container(&format!("/docker-{}.scope", &ID[1..])),
            None,
            "63 digits"
        );
        assert_eq!(container("/"), None);
    }
}
