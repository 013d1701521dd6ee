//! The Kubernetes manifest stays runnable: every `riffle run` flag its pods pass exists, it
//! keeps checkpoints on an object store, and it mounts no shared volume for them.

mod common;

use common::*;

#[test]
fn the_kubernetes_manifest_passes_only_flags_riffle_run_has_and_needs_no_shared_volume() {
    let manifest = std::fs::read_to_string(repo().join("deploy/k8s/riffle.yaml")).unwrap();
    let args_at = manifest
        .find("exec riffle run")
        .expect("the pods run `riffle run`");
    let args: String = manifest[args_at..]
        .lines()
        .take_while(|l| !l.trim_start().starts_with("ports:"))
        .collect::<Vec<_>>()
        .join(" ");
    let flags: Vec<&str> = args
        .split_whitespace()
        .filter(|w| w.starts_with("--"))
        .collect();
    assert!(flags.len() >= 4, "flags found: {flags:?}");
    let help = riffle_ok(&["run", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in &flags {
        assert!(help.contains(flag), "`riffle run` has no {flag}:\n{help}");
    }
    assert!(flags.contains(&"--checkpoint-url"), "{flags:?}");
    assert!(!flags.contains(&"--checkpoint-dir"), "{flags:?}");
    assert!(
        !manifest.contains("persistentVolumeClaim") && !manifest.contains("ReadWriteMany"),
        "no shared volume"
    );
}
