//! The `http` sink end to end against a small HTTP server in the test: retried 503s, refused
//! (400) requests in the dead-letter file, every other row delivered, keys that repeat only
//! with a retried request; a server that is down fails the run naming the URL.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// One request the server answered.
#[derive(Clone, Debug)]
struct Seen {
    key: String,
    content_type: String,
    authorization: String,
    status: u16,
    body: String,
}

#[derive(Clone, Copy)]
enum Mode {
    /// 503 to the first attempt of every third request (by Idempotency-Key), 400 to a body
    /// with a poison row, 200 otherwise.
    Flaky,
    /// 503 to everything.
    Down,
}

struct Server {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

fn serve(mode: Mode) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    std::thread::spawn(move || {
        // Order of first sight per key, and attempts per key.
        let mut keys: BTreeMap<String, (usize, u32)> = BTreeMap::new();
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let Some((headers, body)) = read_request(&stream) else {
                continue;
            };
            let header = |name: &str| headers.get(name).cloned().unwrap_or_default();
            let key = header("idempotency-key");
            let next = keys.len();
            let (index, attempts) = keys.entry(key.clone()).or_insert((next, 0));
            *attempts += 1;
            let status = match mode {
                Mode::Down => 503,
                Mode::Flaky if *index % 3 == 2 && *attempts == 1 => 503,
                Mode::Flaky if body.contains("poison") => 400,
                Mode::Flaky => 200,
            };
            log.lock().unwrap().push(Seen {
                key,
                content_type: header("content-type"),
                authorization: header("authorization"),
                status,
                body,
            });
            let text = if status == 400 {
                "poison row refused"
            } else {
                ""
            };
            let mut stream = stream;
            let _ = write!(
                stream,
                "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                text.len()
            );
        }
    });
    Server { url, seen }
}

/// The request's headers (lower-case names) and body.
fn read_request(stream: &TcpStream) -> Option<(BTreeMap<String, String>, String)> {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut headers = BTreeMap::new();
    loop {
        line.clear();
        reader.read_line(&mut line).ok()?;
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            break;
        }
        let (name, value) = trimmed.split_once(':')?;
        headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
    }
    let length: usize = headers.get("content-length")?.parse().ok()?;
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((headers, String::from_utf8(body).ok()?))
}

const ROWS: i64 = 60;
const POISON: [i64; 2] = [17, 42];

fn pipeline(dir: &Path, url: &str, extra: &str) -> PathBuf {
    let lines: Vec<String> = (0..ROWS)
        .map(|id| {
            let name = if POISON.contains(&id) {
                "poison".to_string()
            } else {
                format!("row-{id}")
            };
            format!(r#"{{"id": {id}, "name": "{name}"}}"#)
        })
        .collect();
    let events = write(dir, "events.jsonl", &(lines.join("\n") + "\n"));
    write(
        dir,
        "http.yaml",
        &format!(
            r#"
name: http
source: {{ jsonl: {{ path: "{events}", batch_size: 16 }} }}
stages:
  - select: {{ columns: [id, name] }}
sink:
  http:
    url: "{url}"
    headers: {{ Authorization: "Bearer ${{HTTP_SINK_TEST_TOKEN}}" }}
    max_rows_per_request: 4
    backoff_ms: 10
    max_backoff_ms: 50
    dead_letter_path: refused.jsonl
{extra}
dead_letter: {{ jsonl: {{ path: stage-dead-letters.jsonl }} }}
runtime: {{ workers: 1, epoch_records: 20 }}
"#,
            events = events.display()
        ),
    )
}

/// `riffle <command> <file>` with the token the pipeline's header names.
fn riffle_with_token(command: &str, file: &Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args([command, file.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .env("HTTP_SINK_TEST_TOKEN", "t0ken")
        .output()
        .unwrap()
}

fn ids(rows: impl IntoIterator<Item = Value>) -> Vec<i64> {
    rows.into_iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect()
}

#[test]
fn good_rows_arrive_refusals_are_dead_letters_and_503s_are_retried() {
    let tmp = tempfile::tempdir().unwrap();
    let server = serve(Mode::Flaky);
    let file = pipeline(tmp.path(), &server.url, "");
    let out = riffle_with_token("run", &file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("t0ken"), "{stderr}");

    let seen = server.seen.lock().unwrap().clone();
    let retried = seen.iter().filter(|s| s.status == 503).count();
    assert!(
        retried >= 3,
        "the server answered {retried} 503s: {seen:#?}"
    );
    for s in &seen {
        assert_eq!(s.content_type, "application/json");
        assert_eq!(s.authorization, "Bearer t0ken");
        // No checkpoints: `<pipeline>@<run start>-<epoch>-<worker>-<n>`.
        let parts: Vec<&str> = s.key.split('-').collect();
        assert!(
            parts.len() == 4
                && parts[0]
                    .strip_prefix("http@")
                    .is_some_and(|t| t.parse::<u64>().is_ok())
                && parts[1..].iter().all(|p| p.parse::<u64>().is_ok()),
            "Idempotency-Key {}",
            s.key
        );
    }
    // Each 503 was followed by an answer to the same request.
    for s in seen.iter().filter(|s| s.status == 503) {
        assert!(
            seen.iter()
                .any(|o| o.key == s.key && o.status != 503 && o.body == s.body),
            "request {} was not retried",
            s.key
        );
    }
    // Rows delivered, once per key; a key delivered twice would be one retried request.
    let mut by_key: BTreeMap<&str, &str> = BTreeMap::new();
    for s in seen.iter().filter(|s| s.status == 200) {
        let before = by_key.insert(&s.key, &s.body);
        assert!(
            before.is_none_or(|b| b == s.body),
            "key {} with two bodies",
            s.key
        );
    }
    let mut delivered = Vec::new();
    for body in by_key.values() {
        let rows: Vec<Value> = serde_json::from_str(body).unwrap();
        assert!((1..=4).contains(&rows.len()), "{body}");
        for row in &rows {
            let id = row["id"].as_i64().unwrap();
            assert_eq!(row["name"], format!("row-{id}"), "{body}");
        }
        delivered.extend(ids(rows));
    }
    let dead = read_jsonl(&tmp.path().join("refused.jsonl"));
    for d in &dead {
        let reason = d["reason"].as_str().unwrap();
        assert!(
            reason.contains("HTTP 400") && reason.contains(&server.url),
            "{reason}"
        );
        assert!(reason.contains("poison row refused"), "{reason}");
    }
    let dead = ids(dead.into_iter().map(|d| d["row"].clone()));
    assert!(
        dead.len() <= 2 * 4,
        "only the refused requests' rows: {dead:?}"
    );
    for p in POISON {
        assert!(
            dead.contains(&p),
            "poison row {p} not a dead letter: {dead:?}"
        );
    }
    let mut all = delivered.clone();
    all.extend(&dead);
    all.sort_unstable();
    assert_eq!(
        all,
        (0..ROWS).collect::<Vec<_>>(),
        "each row delivered or refused, once: delivered {delivered:?}, dead {dead:?}"
    );
    let unique: BTreeSet<i64> = delivered.iter().copied().collect();
    assert_eq!(unique.len(), delivered.len());
}

#[test]
fn a_server_that_stays_down_fails_the_run_naming_the_url() {
    let tmp = tempfile::tempdir().unwrap();
    let server = serve(Mode::Down);
    let file = pipeline(
        tmp.path(),
        &server.url,
        "    max_attempts: 3\n    format: ndjson",
    );
    let started = Instant::now();
    let out = riffle_with_token("run", &file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(60));
    assert!(
        stderr.contains(&server.url) && stderr.contains("3 attempt") && stderr.contains("503"),
        "{stderr}"
    );
    let seen = server.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3, "{seen:#?}");
    assert!(seen.iter().all(|s| s.key == seen[0].key));
    assert!(seen
        .iter()
        .all(|s| s.content_type == "application/x-ndjson"));
}

#[test]
fn bad_settings_fail_validation_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let file = pipeline(tmp.path(), "ftp://127.0.0.1/hook", "");
    let out = riffle_with_token("validate", &file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let line = line_of(&file, "    url:");
    assert!(
        stderr.contains(&format!(":{line}: sink.http.url: "))
            && stderr.contains("expected an `http://`"),
        "{stderr}"
    );
    let file = pipeline(tmp.path(), "http://127.0.0.1/hook", "    max_attempts: 0");
    let out = riffle_with_token("validate", &file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("sink.http.max_attempts: expected an integer from 1"),
        "{stderr}"
    );
}

/// Line crossings of tracked people, as one row per event, to the webhook; the results keep
/// their per-frame lists, which the delivered rows must match one for one.
#[test]
fn line_crossings_go_to_the_webhook_as_one_row_per_event() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let server = serve(Mode::Flaky);
    let videos = repo().join("data/videos");
    assert!(
        videos.join("bikes-3.mp4").is_file(),
        "test videos missing: run scripts/media.sh"
    );
    let file = write(
        tmp.path(),
        "events.yaml",
        &format!(
            r#"
name: crossings
source: {{ video: {{ glob: "{videos}/*.mp4", batch_size: 4 }} }}
stages:{stages}
  - track: {{ track_buffer: 30 }}
  - line_count:
      lines:
        - {{ name: left, from: [160, 0], to: [160, 272] }}
        - {{ name: middle, from: [320, 0], to: [320, 272] }}
        - {{ name: right, from: [480, 0], to: [480, 272] }}
        - {{ name: low, from: [0, 200], to: [640, 200] }}
  - select: {{ columns: [camera_id, frame, pts_ms, line_events] }}
sink: {{ jsonl: {{ path: results.jsonl }} }}
events:
  from: [line_events]
  sink:
    http:
      url: "{url}"
      headers: {{ Authorization: "Bearer ${{HTTP_SINK_TEST_TOKEN}}" }}
      max_rows_per_request: 1
      backoff_ms: 10
      dead_letter_path: refused.jsonl
runtime: {{ workers: 2 }}
"#,
            videos = videos.display(),
            stages = video_tracker_stages(0.1),
            url = server.url,
        ),
    );
    let out = riffle_with_token("run", &file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // What the results say crossed, one entry per event.
    let mut expected = Vec::new();
    for r in read_jsonl(&tmp.path().join("results.jsonl")) {
        for e in r["line_events"].as_array().unwrap() {
            expected.push((
                r["camera_id"].as_str().unwrap().to_string(),
                r["frame"].as_i64().unwrap(),
                r["pts_ms"].as_i64().unwrap(),
                e["line"].as_str().unwrap().to_string(),
                e["track_id"].as_i64().unwrap(),
                e["direction"].as_str().unwrap().to_string(),
            ));
        }
    }
    expected.sort();
    assert!(expected.len() >= 3, "people cross the lines: {expected:?}");
    // What the webhook took: each request once (a retried one repeats its key and body).
    let seen = server.seen.lock().unwrap().clone();
    assert!(
        seen.iter().any(|s| s.status == 503),
        "some requests were retried"
    );
    let mut by_key: BTreeMap<String, String> = BTreeMap::new();
    for s in seen.iter().filter(|s| s.status == 200) {
        assert!(s.key.starts_with("crossings.events@"), "{}", s.key);
        by_key.insert(s.key.clone(), s.body.clone());
    }
    let mut delivered = Vec::new();
    for body in by_key.values() {
        for row in serde_json::from_str::<Vec<Value>>(body).unwrap() {
            assert_eq!(row["event_source"], "line_events", "{row}");
            delivered.push((
                row["camera_id"].as_str().unwrap().to_string(),
                row["frame"].as_i64().unwrap(),
                row["pts_ms"].as_i64().unwrap(),
                row["line"].as_str().unwrap().to_string(),
                row["track_id"].as_i64().unwrap(),
                row["direction"].as_str().unwrap().to_string(),
            ));
        }
    }
    delivered.sort();
    assert_eq!(delivered, expected, "one row per crossing, each once");
}
