//! `contrib/kubernetes/reaper-daemonset.yaml` as a cluster would take it: it validates against
//! the Kubernetes schemas (`kubernetes-validate --strict`, from PyPI, installed by `cargo xtask
//! test`), a manifest with a mistake does not, the container's arguments are reaper-trace's
//! own command line, and its capabilities are the service unit's. Not part of the kernel
//! matrix (nothing here touches the kernel).
use std::{path::Path, process::Command};

use reaper_tests::{host_tool, reaper_trace, scratch};

fn manifest() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../contrib/kubernetes/reaper-daemonset.yaml")
}

#[test]
fn the_daemonset_validates_against_the_kubernetes_schemas() {
    let test = "the_daemonset_validates_against_the_kubernetes_schemas";
    let Some(validate) = host_tool("kubernetes-validate", "kubernetes-validate (pip)", test) else {
        return;
    };
    let run = |file: &Path| {
        let out = Command::new(&validate)
            .arg("--strict")
            .arg(file)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, text) = run(&manifest());
    assert!(ok, "{text}");
    assert!(text.contains("daemonset/reaper-trace"), "{text}");
    // The check can fail: a misspelt field is refused.
    let broken = scratch("kubernetes").join("broken.yaml");
    let yaml = std::fs::read_to_string(manifest()).unwrap();
    std::fs::write(&broken, yaml.replace("hostPID: true", "hostPid: true")).unwrap();
    let (ok, text) = run(&broken);
    assert!(!ok, "a misspelt field passed: {text}");
}

/// The tracer container's `args:` list.
fn container_args(yaml: &str) -> Vec<String> {
    let mut lines = yaml
        .lines()
        .skip_while(|l| l.trim() != "- name: reaper-trace")
        .skip_while(|l| l.trim() != "args:")
        .skip(1);
    let mut args = Vec::new();
    for line in lines.by_ref() {
        let Some(arg) = line.trim().strip_prefix("- ") else {
            break;
        };
        args.push(arg.trim_matches('"').to_owned());
    }
    args
}

#[test]
fn the_daemonsets_arguments_and_capabilities_are_reaper_traces() {
    let yaml = std::fs::read_to_string(manifest()).unwrap();
    let args = container_args(&yaml);
    assert!(args.contains(&"--gateway-exe".to_owned()), "{args:?}");
    // Parsed as reaper-trace parses them (exit 2 is a usage error); here the gateway program
    // is not at the node's path, which is the error it stops at.
    let out = Command::new(reaper_trace()).args(&args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--gateway-exe /host/usr/local/bin/hermes"),
        "{stderr}"
    );
    // The capabilities are exactly the service unit's bounding set.
    let unit = include_str!("../../contrib/reaper-trace.service");
    let mut unit_caps: Vec<String> = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .unwrap()
        .split_whitespace()
        .map(|c| c.trim_start_matches("CAP_").to_owned())
        .collect();
    let mut pod_caps: Vec<String> = yaml
        .lines()
        .find_map(|l| l.trim().strip_prefix("add: ["))
        .unwrap()
        .trim_end_matches(']')
        .split(',')
        .map(|c| c.trim().trim_matches('"').to_owned())
        .collect();
    unit_caps.sort();
    pod_caps.sort();
    assert_eq!(pod_caps, unit_caps);
}

/// The init container runs reaper-trace's own `--mount-bpffs` (exit 2 would be a usage error),
/// and only it is privileged: the tracer keeps its four capabilities.
#[test]
fn the_daemonsets_init_container_mounts_bpffs_with_reaper_traces_own_option() {
    let yaml = std::fs::read_to_string(manifest()).unwrap();
    let init = yaml
        .split("initContainers:")
        .nth(1)
        .expect("an initContainers section");
    assert!(init.contains(r#"args: ["--mount-bpffs"]"#), "{init}");
    assert!(init.contains("mountPropagation: Bidirectional"), "{init}");
    assert_eq!(yaml.matches("privileged: true").count(), 1, "{yaml}");
    let out = Command::new(reaper_trace())
        .args(["--mount-bpffs", "--gateway-pid", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let help = Command::new(reaper_trace()).arg("--help").output().unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("--mount-bpffs"));
}
