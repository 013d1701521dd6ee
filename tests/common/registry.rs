//! The schema registry the Avro and Protobuf tests run against: Apicurio Registry from
//! `scripts/registry.sh` (Confluent-compatible API, in-memory), with confluent-kafka's own
//! Python serializers (`tests/registry_clients/`, installed by `scripts/registry.sh clients`)
//! as the independent client on the other side of each test.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const HOW: &str = "start one with `scripts/registry.sh start && scripts/registry.sh clients` and \
                   `eval \"$(scripts/registry.sh env)\"` (scripts/test.sh does all of it)";

/// `RIFFLE_REGISTRY_URL` (`http://127.0.0.1:PORT/apis/ccompat/v7`, no auth), set by
/// `scripts/test.sh` after `scripts/registry.sh start`; `None` when unset. Tests that need the
/// registry call [`url`], which fails instead.
pub fn registry_url() -> Option<String> {
    std::env::var("RIFFLE_REGISTRY_URL")
        .ok()
        .filter(|u| !u.is_empty())
}

/// [`registry_url`], checked: fails (never skips) when unset or when `GET /subjects` does not
/// answer 200 there, saying how to start one.
pub fn url() -> String {
    let url = registry_url().unwrap_or_else(|| panic!("RIFFLE_REGISTRY_URL is not set: {HOW}"));
    let status = http_status(&url, "/subjects")
        .unwrap_or_else(|e| panic!("no schema registry answers at {url} ({e}): {HOW}"));
    assert_eq!(
        status, 200,
        "GET {url}/subjects answered {status}, not 200: {HOW}"
    );
    url
}

/// The registry's HTTPS address (`RIFFLE_REGISTRY_TLS_URL`), which asks for basic auth with
/// [`credentials`] and presents a certificate signed by [`ca`].
pub fn tls_url() -> String {
    var("RIFFLE_REGISTRY_TLS_URL")
}

/// The CA file (PEM) that signed the HTTPS listener's certificate (`RIFFLE_REGISTRY_CA`).
pub fn ca() -> PathBuf {
    PathBuf::from(var("RIFFLE_REGISTRY_CA"))
}

/// The user and password the HTTPS listener asks for (`RIFFLE_REGISTRY_USER`/`_PASSWORD`).
pub fn credentials() -> (String, String) {
    (var("RIFFLE_REGISTRY_USER"), var("RIFFLE_REGISTRY_PASSWORD"))
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: {HOW}"))
}

/// The status code of a plain-HTTP `GET {url}{path}` (std only: HTTP/1.0, no TLS).
fn http_status(url: &str, path: &str) -> Result<u16, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url} is not an http:// URL"))?;
    let (address, base) = rest.split_once('/').unwrap_or((rest, ""));
    let mut stream = TcpStream::connect(address).map_err(|e| format!("connecting: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "GET /{}{path} HTTP/1.0\r\nHost: {address}\r\n\r\n",
        base.trim_end_matches('/')
    )
    .map_err(|e| format!("sending: {e}"))?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| format!("reading: {e}"))?;
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer: {:?}", answer.lines().next()))
}

/// `tests/registry_clients/`: the producer and consumer scripts, and `common.py`.
pub fn clients_dir() -> PathBuf {
    crate::common::repo().join("tests/registry_clients")
}

/// The clients' python (`RIFFLE_REGISTRY_PYTHON`, else the venv `scripts/registry.sh clients`
/// makes in the cache) with `tests/registry_clients` on its `PYTHONPATH`. Fails when neither is
/// there, saying how to install them.
pub fn python() -> Command {
    let python = std::env::var_os("RIFFLE_REGISTRY_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::common::cache_dir().join("registry-clients/bin/python"));
    assert!(
        python.is_file(),
        "the registry clients' python ({}) is missing: {HOW}",
        python.display()
    );
    let mut command = Command::new(python);
    command
        .env("PYTHONPATH", clients_dir())
        .env("PYTHONDONTWRITEBYTECODE", "1");
    command
}

/// Runs a Python snippet (`python -c script args…`: `sys.argv[1:]` is `args`) with the
/// clients, and returns its standard output; fails with its stderr when it fails.
pub fn run_python(script: &str, args: &[&str]) -> String {
    let out = python()
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("running the registry clients' python");
    assert!(
        out.status.success(),
        "python snippet failed ({}):\n{script}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("python printed UTF-8")
}

/// Runs one of the scripts in `tests/registry_clients/` (`produce_avro.py`, …) with `args`,
/// and returns its standard output; fails with its stderr when it fails.
pub fn run_client(script: &str, args: &[&str]) -> String {
    let path = clients_dir().join(script);
    let out = python()
        .arg(&path)
        .args(args)
        .output()
        .expect("running the registry clients' python");
    assert!(
        out.status.success(),
        "{script} {args:?} failed ({}):\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("the script printed UTF-8")
}

/// The JSON lines a `consume_*.py` script printed, parsed.
pub fn rows(output: &str) -> Vec<serde_json::Value> {
    output
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}
