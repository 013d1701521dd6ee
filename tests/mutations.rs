//! `riffle validate` on hundreds of mutated copies of the shipped pipeline files: it never
//! panics, never hangs, stays within bounded memory and prints a bounded error. Alone in its
//! test binary, so the peak memory of the children it measures is theirs only.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Shipped files that validate without a broker (the Kafka ones would wait on one).
const FILES: &[&str] = &[
    "camera-perception.yaml",
    "camera-classify.yaml",
    "camera-classify-split.yaml",
    "camera-cascade.yaml",
    "camera-tracking.yaml",
    "camera-video.yaml",
    "clickstream-recs.yaml",
];
const VARIANTS_PER_FILE: usize = 46;
const TIMEOUT: Duration = Duration::from_secs(30);
const MAX_RSS_MB: i64 = 1536;
/// An error names the field and quotes a bounded excerpt, never a whole input.
const MAX_STDERR: usize = 16 * 1024;

/// A random pick from `items`.
fn pick<'a>(rng: &mut Rng, items: &[&'a str]) -> &'a str {
    items[rng.below(items.len())]
}

const NUMBERS: &[&str] = &[
    "0",
    "-1",
    "1",
    "2147483648",
    "9223372036854775807",
    "18446744073709551616",
    "1e308",
    "-1e308",
    "0.5",
    ".nan",
    ".inf",
];
const VALUES: &[&str] = &[
    "/dev/zero",
    "/",
    "''",
    "[[[[[[[[",
    "{",
    "~",
    "!!binary AAAA",
    "[]",
    "{}",
    "\"\\u0000\"",
    "${UNSET_RIFFLE_VAR}",
];
/// Each alias multiplies by ten: expanded naively, the last one is 10^7 strings.
const ALIAS_BOMB: &str = "bomb:\n  a: &a [x, x, x, x, x, x, x, x, x, x]\n  b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n  c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n  d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n  e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n  f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n  g: [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]\n";

fn mutate(text: &str, rng: &mut Rng) -> Vec<u8> {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for _ in 0..1 + rng.below(3) {
        let n = lines.len().max(1);
        let at = rng.below(n).min(lines.len().saturating_sub(1));
        match rng.below(10) {
            0 => {
                // A number becomes an extreme one.
                let numbered: Vec<usize> = (0..lines.len())
                    .filter(|&i| lines[i].bytes().any(|b| b.is_ascii_digit()))
                    .collect();
                if let Some(&i) = numbered.get(rng.below(numbered.len())) {
                    let line = &lines[i];
                    let start = line.find(|c: char| c.is_ascii_digit()).unwrap_or(0);
                    let end = line[start..]
                        .find(|c: char| !c.is_ascii_digit() && c != '.')
                        .map_or(line.len(), |e| start + e);
                    lines[i] = format!("{}{}{}", &line[..start], pick(rng, NUMBERS), &line[end..]);
                }
            }
            1 if !lines.is_empty() => {
                lines.remove(at);
            }
            2 if !lines.is_empty() => {
                let line = lines[at].clone();
                lines.insert(at, line);
            }
            3 if !lines.is_empty() => {
                let other = rng.below(lines.len());
                lines.swap(at, other);
            }
            4 if !lines.is_empty() => {
                // A value becomes something odd (a device, an unclosed list, a huge string).
                if let Some((key, _)) = lines[at].split_once(": ") {
                    let value = if rng.below(4) == 0 {
                        "x".repeat(1 << 20)
                    } else {
                        pick(rng, VALUES).to_string()
                    };
                    lines[at] = format!("{key}: {value}");
                }
            }
            5 if !lines.is_empty() => {
                if rng.below(2) == 0 {
                    lines[at].insert_str(0, "  ");
                } else {
                    lines[at] = lines[at].trim_start().to_string();
                }
            }
            6 => lines.insert(0, ALIAS_BOMB.to_string()),
            7 if !lines.is_empty() => {
                // A known key with a nested block that does not belong there.
                let key = pick(
                    rng,
                    &["workers", "batch", "path", "model", "stages", "source"],
                );
                lines.insert(at, format!("  {key}: {{ {key}: [{key}, {{ {key}: 1 }}] }}"));
            }
            _ => {}
        }
    }
    let mut bytes = lines.join("\n").into_bytes();
    match rng.below(6) {
        // Cut anywhere (a torn file), or with bytes that are not UTF-8.
        0 => bytes.truncate(rng.below(bytes.len())),
        1 => {
            let at = rng.below(bytes.len());
            let junk: Vec<u8> = (0..1 + rng.below(16)).map(|_| rng.next() as u8).collect();
            bytes.splice(at..at, junk);
        }
        _ => {}
    }
    bytes
}

/// Peak resident memory of the waited-for children, in MB.
fn children_peak_rss_mb() -> i64 {
    // SAFETY: getrusage writes into the zeroed struct we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    usage.ru_maxrss / 1024
}

#[test]
fn validate_survives_mutated_pipeline_files() {
    require_onnx_runtime();
    let mut rng = Rng::seeded("RIFFLE_MUTATION_SEED");
    let seed = rng.seed;
    let tmp = tempfile::tempdir().unwrap();
    let (mut ok, mut refused, mut slowest) = (0, 0, Duration::ZERO);
    for name in FILES {
        // Absolute paths, so the copies find the models and frames from the temporary dir
        // (and write their outputs there).
        let text = shipped(name, tmp.path());
        for variant in 0..VARIANTS_PER_FILE {
            let file = tmp.path().join(format!("{variant}-{name}"));
            std::fs::write(&file, mutate(&text, &mut rng)).unwrap();
            let started = Instant::now();
            let mut child = Command::new(env!("CARGO_BIN_EXE_riffle"))
                .args(["validate", file.to_str().unwrap()])
                .env("RUST_LOG", "error")
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let mut stderr_pipe = child.stderr.take().unwrap();
            let reader = std::thread::spawn(move || {
                let mut s = Vec::new();
                let _ = stderr_pipe.read_to_end(&mut s);
                s
            });
            let status = loop {
                if let Some(status) = child.try_wait().unwrap() {
                    break status;
                }
                if started.elapsed() > TIMEOUT {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "seed {seed}: validate hung on {} (kept for inspection)",
                        file.display()
                    );
                }
                std::thread::sleep(Duration::from_millis(5));
            };
            slowest = slowest.max(started.elapsed());
            let stderr = reader.join().unwrap();
            let text = String::from_utf8_lossy(&stderr);
            assert!(
                !text.contains("panicked") && matches!(status.code(), Some(0 | 1)),
                "seed {seed}: {} ended with {status}: {text}",
                file.display()
            );
            assert!(
                stderr.len() <= MAX_STDERR,
                "seed {seed}: {} printed {} bytes of errors",
                file.display(),
                stderr.len()
            );
            if status.success() {
                ok += 1;
            } else {
                refused += 1;
            }
            std::fs::remove_file(&file).unwrap();
        }
    }
    let peak = children_peak_rss_mb();
    eprintln!(
        "{} variants: {ok} valid, {refused} refused with an error; slowest {slowest:?}; peak RSS {peak} MB",
        ok + refused
    );
    assert!(ok + refused >= 300);
    assert!(refused > 0 && ok > 0, "mutations both break and keep files");
    assert!(
        peak <= MAX_RSS_MB,
        "seed {seed}: validate peaked at {peak} MB"
    );
}
