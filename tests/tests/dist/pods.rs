//! The OCI image as the DaemonSet runs it, under podman on a node modelled by a directory of
//! the test's own: a leak of a gateway on the host flagged, the lineage kept across a roll of
//! the pods (with and without bpffs on the node), and a pod that cannot keep its state.
use super::*;

/// The node a pod runs on, as the DaemonSet's `bpffs` volume sees it: the node's
/// `/sys/fs/bpf`, modelled by a directory of the test's own (so that no test depends on, or
/// changes, what the host has mounted) made a shared mount, as systemd makes every mount.
/// `with_bpffs`: bpffs mounted on it, as systemd does at boot; without: a minimal node image,
/// where the init container must mount it. Unmounted however the test ends: what the pods
/// pinned in it goes with it.
struct Node {
    bpf: PathBuf,
}

impl Node {
    fn new(dir: &Path, with_bpffs: bool) -> Node {
        let bpf = dir.join("node-sys-fs-bpf");
        std::fs::create_dir_all(&bpf).unwrap();
        let node = Node { bpf };
        match with_bpffs {
            true => ok(Command::new("mount")
                .args(["-t", "bpf", "bpf"])
                .arg(&node.bpf)),
            false => ok(Command::new("mount")
                .arg("--bind")
                .arg(&node.bpf)
                .arg(&node.bpf)),
        };
        ok(Command::new("mount").arg("--make-shared").arg(&node.bpf));
        node
    }

    /// Whether a bpffs is mounted on the node's /sys/fs/bpf now.
    fn has_bpffs(&self) -> bool {
        reaper_user::testing::is_bpffs(&self.bpf)
    }
}

impl Drop for Node {
    /// Unmounts every mount stacked on the node's directory (the init container's bpffs lies on
    /// the bind mount made shared), top first, until none is left.
    fn drop(&mut self) {
        for _ in 0..8 {
            let unmounted = Command::new("umount")
                .args(["--recursive", "--lazy"])
                .arg(&self.bpf)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !unmounted {
                break;
            }
        }
    }
}

/// `podman run` with what this test machine needs of every container: `runc` (crun refuses a
/// hybrid cgroup host) and explicit ulimits (podman's defaults for root exceed what a sandbox
/// without CAP_SYS_RESOURCE may set).
fn podman_run(name: &str) -> Command {
    let mut cmd = Command::new("podman");
    cmd.args(["--runtime", "runc", "run", "--name", name])
        .args([
            "--ulimit",
            "nofile=4096:4096",
            "--ulimit",
            "nproc=4096:4096",
        ]);
    cmd
}

/// The DaemonSet's init container: privileged, the node's /sys/fs/bpf with Bidirectional
/// propagation (`rshared`), `--mount-bpffs`. Runs to its end; returns what it said.
fn init_container_like_the_daemonset(name: &str, node: &Node, image: &Path) -> String {
    let out = podman_run(&format!("{name}-init"))
        .args(["--rm", "--privileged", "--network=none"])
        .arg("-v")
        .arg(format!("{}:/sys/fs/bpf:rshared", node.bpf.display()))
        .arg(format!("oci-archive:{}", image.display()))
        .arg("--mount-bpffs")
        .output()
        .unwrap();
    assert!(out.status.success(), "the init container: {}", said(&out));
    said(&out)
}

/// `podman run -d` as the DaemonSet runs the tracer's container: host pid namespace, all
/// capabilities dropped but the four it lists, no seccomp filter, no privilege escalation, a
/// read-only root, the host's BTF, root filesystem (read-only, at /host), a log directory, a
/// state directory and the node's /sys/fs/bpf (HostToContainer: `rslave`).
fn podman_like_the_daemonset(
    name: &str,
    node: &Node,
    (logs, state): (&Path, &Path),
    image: &Path,
    args: &[&str],
) -> Command {
    let mut cmd = podman_run(name);
    cmd.arg("-d")
        .args(["--pid=host", "--network=none", "--cap-drop=all"])
        .args(["--cap-add=BPF,PERFMON,SYS_PTRACE,DAC_READ_SEARCH"])
        .args(["--security-opt", "seccomp=unconfined"])
        .args(["--security-opt", "no-new-privileges", "--read-only"])
        .args([
            "-v",
            "/sys/kernel/btf:/sys/kernel/btf:ro",
            "-v",
            "/:/host:ro",
        ])
        .arg("-v")
        .arg(format!("{}:/var/log/reaper", logs.display()))
        .arg("-v")
        .arg(format!("{}:/var/lib/reaper-trace", state.display()))
        .arg("-v")
        .arg(format!("{}:/sys/fs/bpf:rslave", node.bpf.display()))
        .arg(format!("oci-archive:{}", image.display()))
        .args(args);
    cmd
}

/// A pod as the DaemonSet starts one: its init container, then the tracer's.
fn pod_like_the_daemonset(
    name: &str,
    node: &Node,
    dirs: (&Path, &Path),
    image: &Path,
    args: &[&str],
) -> Container {
    init_container_like_the_daemonset(name, node, image);
    ok(&mut podman_like_the_daemonset(
        name, node, dirs, image, args,
    ));
    Container(name.to_owned())
}

/// What a podman test needs: this run's image, and a scratch directory holding the pod's log
/// and state directories (as the DaemonSet mounts them); none when the test must be skipped.
fn pod_setup(test: &str) -> Option<(PathBuf, PathBuf, (PathBuf, PathBuf))> {
    if !require_root(test) {
        return None;
    }
    let image = made_by_this_run(test, "REAPER_DIST_IMAGE")?;
    let dir = scratch(test);
    let (logs, state) = (dir.join("logs"), dir.join("state"));
    for d in [&logs, &state] {
        std::fs::create_dir_all(d).unwrap();
    }
    Some((image, dir, (logs, state)))
}

/// A container this test started: stopped and removed however the test ends.
struct Container(String);

impl Container {
    /// Stops it (SIGTERM: reaper-trace writes its summary) and returns what it printed.
    fn stop(&self) -> String {
        let _ = Command::new("podman")
            .args(["stop", "-t", "20", &self.0])
            .output();
        self.logs()
    }

    fn logs(&self) -> String {
        Command::new("podman")
            .args(["logs", &self.0])
            .output()
            .map(|o| said(&o))
            .unwrap_or_default()
    }

    /// Its exit status once it has exited; `None` while it starts or runs (a container
    /// being created is not running either, and says exit code 0: on a loaded machine the
    /// pod is polled in that state).
    fn exit_code(&self) -> Option<i64> {
        let out = Command::new("podman")
            .args([
                "inspect",
                "--format",
                "{{.State.Status}} {{.State.ExitCode}}",
            ])
            .arg(&self.0)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        match text.split_whitespace().collect::<Vec<_>>()[..] {
            ["exited" | "stopped", code] => code.parse().ok(),
            _ => None,
        }
    }

    /// Waits for `done`, failing at once with the container's log when it exits first (a
    /// pod that cannot keep its state exits at start), or after the tests' patience.
    fn wait_while_running<T>(&self, what: &str, mut done: impl FnMut() -> Option<T>) -> T {
        let start = Instant::now();
        loop {
            if let Some(found) = done() {
                return found;
            }
            if let Some(code) = self.exit_code() {
                panic!(
                    "{what}: the container {} exited ({code}) first: {}",
                    self.0,
                    self.logs()
                );
            }
            assert!(
                start.elapsed() < patience(),
                "{what}: not within {:?}; the container said: {}",
                patience(),
                self.stop()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until it has exited; returns its status and log.
    fn wait_for_exit(&self) -> (i64, String) {
        let start = Instant::now();
        loop {
            if let Some(code) = self.exit_code() {
                return (code, self.logs());
            }
            assert!(
                start.elapsed() < patience(),
                "the container {} still runs after {:?}: {}",
                self.0,
                patience(),
                self.stop()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("podman").args(["rm", "-f", &self.0]).output();
    }
}

/// The events of the NDJSON file at `path` once `proof` holds over them.
fn events_if(path: &Path, proof: impl Fn(&[Value]) -> bool) -> Option<Vec<Value>> {
    let events: Vec<Value> = std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    proof(&events).then_some(events)
}

/// A directory removed however the test ends.
struct RemovedAtEnd(PathBuf);

impl Drop for RemovedAtEnd {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// In a module of their own, so that `cargo xtask test --no-dist` leaves them out by name
/// (`--skip installed_artifacts::`) rather than letting them skip.
mod installed_artifacts {
    use super::*;

    /// The archive's one image is an index of an image for each architecture reaper-trace is
    /// built for, and podman picks the node's: pulled as a node of this machine's
    /// architecture and as an arm64 (or x86_64) one, each gets the binary of its own. Pulled
    /// into a podman of the test's own (its store, run root and libpod state: neither the
    /// host's images nor its podman's state are touched).
    #[test]
    fn the_image_is_one_index_and_podman_pulls_the_variant_of_the_nodes_platform() {
        let test = "the_image_is_one_index_and_podman_pulls_the_variant_of_the_nodes_platform";
        let Some((image, dir, _)) = pod_setup(test) else {
            return;
        };
        // podman refuses a run root longer than 50 bytes: a short one of this test's.
        let run_root = RemovedAtEnd(
            std::env::temp_dir().join(format!("reaper-podman-{}", std::process::id())),
        );
        let podman = |args: &[&str]| {
            let mut cmd = Command::new("podman");
            cmd.arg("--root")
                .arg(dir.join("store"))
                .arg("--runroot")
                .arg(&run_root.0)
                .arg("--tmpdir")
                .arg(dir.join("libpod"))
                .args(["--storage-driver", "vfs"])
                .args(args);
            ok(&mut cmd)
        };
        let archive = format!("oci-archive:{}", image.display());
        let name = format!("reaper-trace:{}", env!("CARGO_PKG_VERSION"));
        for (arch, elf_machine) in [("amd64", 62u16), ("arm64", 183)] {
            podman(&["pull", "-q", "--arch", arch, &archive]);
            let said = podman(&[
                "image",
                "inspect",
                "--format",
                "{{.Os}}/{{.Architecture}}",
                &name,
            ]);
            assert_eq!(said.trim(), format!("linux/{arch}"), "{name} as pulled");
            // The binary in that image is code of the platform it was picked for.
            let copy = dir.join(format!("reaper-trace-{arch}"));
            let container = podman(&["create", "--arch", arch, &name]);
            let container = container.trim();
            let from = format!("{container}:/usr/bin/reaper-trace");
            podman(&["cp", &from, copy.to_str().unwrap()]);
            podman(&["rm", container]);
            let binary = std::fs::read(&copy).unwrap();
            let machine = u16::from_le_bytes([binary[0x12], binary[0x13]]);
            assert_eq!(
                machine, elf_machine,
                "e_machine of the {arch} image's binary"
            );
            podman(&["rmi", &name]);
        }
        // Each image was removed; the vfs store (plain directories, nothing mounted) goes with
        // the scratch directory.
        // Every layer is a whole tar: Go's archive/tar (containerd's, on a Kubernetes node)
        // refuses one that ends inside its last file's padding, which podman lets by.
        let layout = dir.join("layout");
        std::fs::create_dir_all(&layout).unwrap();
        ok(Command::new("tar")
            .arg("-xf")
            .arg(&image)
            .arg("-C")
            .arg(&layout));
        let json = |digest: &Value| -> Value {
            let hex = digest.as_str().unwrap().strip_prefix("sha256:").unwrap();
            let blob = std::fs::read(layout.join("blobs/sha256").join(hex)).unwrap();
            serde_json::from_slice(&blob).unwrap()
        };
        let top: Value =
            serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
        let index = json(&top["manifests"][0]["digest"]);
        let platforms = index["manifests"].as_array().unwrap();
        assert_eq!(platforms.len(), 2, "{index}");
        for platform in platforms {
            for layer in json(&platform["digest"])["layers"].as_array().unwrap() {
                let hex = layer["digest"]
                    .as_str()
                    .unwrap()
                    .strip_prefix("sha256:")
                    .unwrap();
                ok(Command::new("tar")
                    .arg("-tzf")
                    .arg(layout.join("blobs/sha256").join(hex)));
            }
        }
    }

    #[test]
    fn the_image_under_podman_flags_a_leak_of_a_gateway_on_the_host() {
        let test = "the_image_under_podman_flags_a_leak_of_a_gateway_on_the_host";
        let Some((image, dir, (logs, state))) = pod_setup(test) else {
            return;
        };
        let node = Node::new(&dir, true);
        let program = dir.join("bin/hermes");
        std::fs::create_dir_all(program.parent().unwrap()).unwrap();
        std::fs::copy(shapes(), &program).unwrap();
        let selected = format!("/host{}", program.display());
        let name = format!("reaper-dist-test-{}", std::process::id());
        let container = pod_like_the_daemonset(
            &name,
            &node,
            (&logs, &state),
            &image,
            &[
                "--gateway-exe",
                &selected,
                "--quiet",
                "--scan-interval",
                "250ms",
                "--output",
                "/var/log/reaper/audit.ndjson",
            ],
        );
        let audit = logs.join("audit.ndjson");
        container.wait_while_running("reaper-trace in the container to get ready", || {
            events_if(&audit, |ev| ev.iter().any(|e| e["event"] == "ready"))
        });
        let mut instance = Instance::start(&dir, "hermes", &program, &["leak-orphan"], None, false);
        let gateway = instance.pid();
        let flagged = |e: &Value| {
            e["event"] == "flag"
                && e["reason"] == "orphaned"
                && e["lineage"][0].as_u64() == Some(gateway)
        };
        let seen = std::panic::catch_unwind(|| {
            container.wait_while_running("the orphan's flag", || {
                events_if(&audit, |ev| ev.iter().any(flagged))
            })
        });
        instance.finish();
        let said = container.stop();
        let events = seen.unwrap_or_else(|_| panic!("no flag; the container said: {said}"));
        let flag = events.iter().find(|e| flagged(e)).unwrap();
        assert_eq!(pid(&flag["pid"]), instance.orphan(), "{flag}");
        let announced = events
            .iter()
            .find(|e| e["event"] == "gateway" && pid(&e["pid"]) == gateway)
            .unwrap_or_else(|| panic!("no gateway event for {gateway}: {events:?}"));
        assert_eq!(
            announced["selector"],
            format!("exe:{selected}"),
            "{announced}"
        );
    }

    /// The DaemonSet's pod rolled (stopped, a new one started with the same mounts) on a node
    /// whose bpffs systemd mounted: a helper orphaned between the two pods is flagged with its
    /// whole lineage by the new one, from the lineage the old one kept in the state directory.
    #[test]
    fn a_daemonset_roll_keeps_the_lineage_of_a_helper_orphaned_between_the_pods() {
        let test = "a_daemonset_roll_keeps_the_lineage_of_a_helper_orphaned_between_the_pods";
        let Some((image, dir, dirs)) = pod_setup(test) else {
            return;
        };
        let node = Node::new(&dir, true);
        roll("with", &dir, &node, &image, dirs);
    }

    /// The same roll on a node without bpffs (no systemd to mount it): the init container
    /// mounts it on the node, where it outlives the pod, and the tracer keeps its state there.
    #[test]
    fn on_a_node_without_bpffs_the_init_container_mounts_it_and_a_roll_keeps_the_lineage() {
        let test =
            "on_a_node_without_bpffs_the_init_container_mounts_it_and_a_roll_keeps_the_lineage";
        let Some((image, dir, dirs)) = pod_setup(test) else {
            return;
        };
        let node = Node::new(&dir, false);
        assert!(!node.has_bpffs(), "the node starts without bpffs");
        roll("without", &dir, &node, &image, dirs);
        assert!(node.has_bpffs(), "the init container's mount is the node's");
    }

    /// Without the init container, on a node without bpffs, the tracer cannot keep its state
    /// (it may not mount): it exits at once, non-zero, its log naming bpffs and the way out.
    #[test]
    fn a_pod_that_cannot_keep_its_state_exits_at_once_saying_why() {
        let test = "a_pod_that_cannot_keep_its_state_exits_at_once_saying_why";
        let Some((image, dir, (logs, state))) = pod_setup(test) else {
            return;
        };
        let node = Node::new(&dir, false);
        let mut gateway = Command::new("sleep").arg("600").spawn().expect("sleep");
        let gw = gateway.id().to_string();
        let name = format!("reaper-no-bpffs-{}", std::process::id());
        ok(&mut podman_like_the_daemonset(
            &name,
            &node,
            (&logs, &state),
            &image,
            &[
                "--gateway-pid",
                &gw,
                "--quiet",
                "--state-dir",
                "/var/lib/reaper-trace",
            ],
        ));
        let container = Container(name);
        let (code, said) = container.wait_for_exit();
        let _ = gateway.kill();
        let _ = gateway.wait();
        assert_ne!(code, 0, "{said}");
        assert!(
            said.contains("bpffs is not mounted") && said.contains("--mount-bpffs"),
            "{said}"
        );
        assert!(!node.has_bpffs());
    }

    /// Two pods in turn on `node` with `--state-dir`: a helper orphaned while none runs is
    /// flagged by the second with the lineage the first kept; then a pod releases the state.
    /// `tag` keeps this roll's container names apart from another test's.
    fn roll(tag: &str, dir: &Path, node: &Node, image: &Path, (logs, state): (PathBuf, PathBuf)) {
        let mut gateway = OrphanLater::start_late(dir);
        let (gw, a) = (gateway.gateway, gateway.a);
        let gw_arg = gw.to_string();
        let pod = |n: u32, out: &str| {
            let name = format!("reaper-roll-{tag}-{n}-{}", std::process::id());
            let args = [
                "--gateway-pid",
                &gw_arg,
                "--quiet",
                "--state-dir",
                "/var/lib/reaper-trace",
                "--output",
                out,
            ];
            pod_like_the_daemonset(&name, node, (&logs, &state), image, &args)
        };
        let first = pod(1, "/var/log/reaper/first.ndjson");
        let held = std::panic::catch_unwind(|| {
            first.wait_while_running("the first pod's checkpoint to hold the child", || {
                checkpointed(&state).contains(&a).then_some(())
            })
        });
        first.stop();
        if held.is_err() {
            gateway.finish();
            panic!("the first pod never kept the lineage");
        }
        // Between the pods: A forks B, which calls setsid, and exits; B is reparented.
        gateway.orphan_b();
        let b = gateway.b;
        let second = pod(2, "/var/log/reaper/second.ndjson");
        let flagged =
            |e: &Value| e["event"] == "flag" && e["reason"] == "orphaned" && pid(&e["pid"]) == b;
        let seen = std::panic::catch_unwind(|| {
            second.wait_while_running("the helper's flag", || {
                events_if(&logs.join("second.ndjson"), |ev| ev.iter().any(flagged))
            })
        });
        gateway.finish();
        let said = second.stop();
        let events = seen.unwrap_or_else(|_| panic!("no flag; the second pod said: {said}"));
        let flag = events.iter().find(|e| flagged(e)).unwrap();
        assert_eq!(flag["lineage"], serde_json::json!([gw, a, b]), "{flag}");
        // Read from the pinned ring: B's birth once, as it happened between the pods.
        let forks: Vec<&Value> = events
            .iter()
            .filter(|e| e["event"] == "fork" && pid(&e["pid"]) == b)
            .collect();
        assert_eq!(forks.len(), 1, "{forks:?}");
        assert_eq!(events[0]["resumed"]["kernel_kept"], true, "{}", events[0]);
        // A pod with the same mounts releases what the pods kept in the node's bpffs.
        let release = Container(format!("reaper-roll-{tag}-release-{}", std::process::id()));
        ok(&mut podman_like_the_daemonset(
            &release.0,
            node,
            (&logs, &state),
            image,
            &["--release-state", "/var/lib/reaper-trace"],
        ));
        let (code, said) = release.wait_for_exit();
        assert_eq!(code, 0, "{said}");
        assert!(said.contains("probes detached"), "{said}");
    }
}
