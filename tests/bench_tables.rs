//! The benchmark tables print a ratio, and a target "met", only between runs that produced the
//! same outputs: `scripts/lib/peers_table.py` (the peers table of `scripts/bench-peers.sh`) on
//! fabricated raw lines, where digests agree, differ between Riffle and the peers, differ among
//! the peers, change between rounds, or are missing.

use std::path::Path;
use std::process::Command;

/// One raw line per run: `<round> PEER <name> <job> ...` as `scripts/bench-peers.sh` collects.
fn line(round: u32, name: &str, job: &str, items_per_s: f64, check: Option<&str>) -> String {
    let latency = if name.starts_with("riffle") {
        " p50_ms=3.00 p99_ms=5.00"
    } else {
        ""
    };
    let check = check.map(|c| format!(" check={c}")).unwrap_or_default();
    format!("{round} PEER {name} {job} items=100 seconds=1.000 items_per_s={items_per_s:.1}{latency}{check}")
}

/// Three rounds of `job`: Riffle at 400 items/s, two peers at 100 and 90, ONNX Runtime alone at
/// 500; `check(round, name)` gives each run's digest.
fn rounds(job: &str, check: impl Fn(u32, &str) -> Option<&'static str>) -> Vec<String> {
    let mut lines = Vec::new();
    for r in 1..=3 {
        for (name, rate) in [
            ("riffle-w2", 400.0),
            ("ortonly-s2", 500.0),
            ("plain", 90.0),
            ("bytewax-w2", 100.0),
        ] {
            lines.push(line(r, name, job, rate, check(r, name)));
        }
    }
    lines
}

/// The table `peers_table.py` prints for `lines`.
fn table(lines: &[String]) -> String {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("lines.txt");
    std::fs::write(&file, lines.join("\n") + "\n").expect("writing the raw lines");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/lib/peers_table.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(&file)
        .output()
        .expect("running python3 (the bench scripts need it)");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "peers_table.py failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The table's row for `job`.
fn row<'a>(table: &'a str, job: &str) -> &'a str {
    table
        .lines()
        .find(|l| l.starts_with(&format!("| {job} |")))
        .unwrap_or_else(|| panic!("no {job} row in:\n{table}"))
}

/// The row's cells, without the leading and trailing pipes.
fn cells(row: &str) -> Vec<&str> {
    row.trim_matches('|').split(" | ").map(str::trim).collect()
}

#[test]
fn equal_outputs_give_ratios_and_met() {
    let t = table(&rounds("classify", |_, _| Some("sha1=aaaaaaaaaaaa")));
    let c = cells(row(&t, "classify"));
    assert_eq!(
        c[3], "4.00 (4.00–4.00)",
        "Riffle ÷ best peer (bytewax-w2): {t}"
    );
    assert_eq!(c[4], "≥ 1.0× (met)", "{t}");
    assert_eq!(c[6], "0.80 (0.80–0.80)", "Riffle ÷ ONNX Runtime alone: {t}");
    assert_eq!(c[8], "sha1=aaaaaaaaaaaa (all agree)", "{t}");
}

#[test]
fn riffle_differing_from_the_peers_is_never_met() {
    let t = table(&rounds("classify", |_, name| {
        Some(if name.starts_with("riffle") {
            "sha1=da9571e1e817"
        } else {
            "sha1=349225402313"
        })
    }));
    let r = row(&t, "classify");
    let c = cells(r);
    // Four times the best peer's rate, yet no ratio and no "met": the work was not the same.
    assert_eq!(c[3], "**outputs differ**", "{t}");
    assert_eq!(c[4], "≥ 1.0× (**outputs differ**)", "{t}");
    assert_eq!(c[6], "**outputs differ**", "{t}");
    assert!(!r.contains("(met)") && !r.contains("4.00"), "{r}");
    assert!(
        c[8].contains("Riffle: sha1=da9571e1e817")
            && c[8].contains("bytewax-w2, ortonly-s2, plain: sha1=349225402313"),
        "the outputs cell names who printed which digest: {r}"
    );
}

#[test]
fn peers_that_disagree_among_themselves_give_no_ratio() {
    let t = table(&rounds("ctr", |_, name| {
        Some(if name == "plain" {
            "sha1=bbbbbbbbbbbb"
        } else {
            "sha1=aaaaaaaaaaaa"
        })
    }));
    let r = row(&t, "ctr");
    let c = cells(r);
    assert_eq!(c[3], "**peers' outputs differ**", "{t}");
    assert_eq!(
        c[4], "≥ 3.0×, p99 ≤ 10 ms (**peers' outputs differ**)",
        "{t}"
    );
    assert!(!r.contains("(met)"), "{r}");
}

#[test]
fn a_digest_that_changes_in_one_round_is_a_difference() {
    // Riffle agrees in rounds 1 and 3, not in round 2.
    let t = table(&rounds("classify", |round, name| {
        Some(if round == 2 && name.starts_with("riffle") {
            "sha1=cccccccccccc"
        } else {
            "sha1=aaaaaaaaaaaa"
        })
    }));
    let r = row(&t, "classify");
    assert_eq!(cells(r)[3], "**outputs differ**", "{t}");
    assert!(!r.contains("(met)"), "{r}");
}

#[test]
fn a_run_without_a_check_is_not_compared() {
    let t = table(&rounds("detect", |_, name| {
        (name != "bytewax-w2").then_some("person_frames=53,person_boxes=56")
    }));
    let r = row(&t, "detect");
    assert_eq!(cells(r)[3], "**outputs not checked**", "{t}");
    assert!(!r.contains("(met)"), "{r}");
}

#[test]
fn each_job_is_judged_on_its_own_outputs() {
    // detect agrees and is fast; classify differs: only classify loses its ratio.
    let mut lines = rounds("detect", |_, _| Some("person_frames=53,person_boxes=56"));
    lines.extend(rounds("classify", |_, name| {
        Some(if name.starts_with("riffle") {
            "sha1=da9571e1e817"
        } else {
            "sha1=349225402313"
        })
    }));
    let t = table(&lines);
    assert_eq!(cells(row(&t, "detect"))[4], "≥ 1.0× (met)", "{t}");
    assert_eq!(
        cells(row(&t, "classify"))[4],
        "≥ 1.0× (**outputs differ**)",
        "{t}"
    );
}
