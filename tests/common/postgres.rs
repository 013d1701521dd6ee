//! The PostgreSQL server the sink tests run against, and `psql` (an independent client) to set
//! tables up and read them back.

use std::path::PathBuf;
use std::process::Command;

const HOW: &str = "start a server with `scripts/postgres.sh start` and set RIFFLE_PG_URL with \
                   `eval \"$(scripts/postgres.sh env)\"` (scripts/test.sh does both)";

/// `RIFFLE_PG_URL`. Fails (never skips) when unset or when the server does not answer, saying
/// how to start one.
pub fn url() -> String {
    let url = std::env::var("RIFFLE_PG_URL")
        .unwrap_or_else(|_| panic!("RIFFLE_PG_URL is not set: {HOW}"));
    let out = psql_command(&url, "SELECT 1").output().unwrap_or_else(|e| {
        panic!("cannot run psql ({e}): install the PostgreSQL client (apt-get install postgresql)")
    });
    assert!(
        out.status.success(),
        "no PostgreSQL server at RIFFLE_PG_URL ({}): {HOW}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    url
}

/// `psql`: on PATH, else Debian's newest under /usr/lib/postgresql.
fn psql_binary() -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("psql"))
            .find(|p| p.is_file())
    });
    if let Some(p) = on_path {
        return p;
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin/psql"))
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found.pop().unwrap_or_else(|| PathBuf::from("psql"))
}

fn psql_command(url: &str, sql: &str) -> Command {
    let mut c = Command::new(psql_binary());
    // Unaligned, tuples only, fields split by the unit separator (never in the test data).
    c.args([
        "-X",
        "-q",
        "-A",
        "-t",
        "-v",
        "ON_ERROR_STOP=1",
        "-F",
        "\u{1f}",
    ])
    .arg("-d")
    .arg(url)
    .arg("-c")
    .arg(sql);
    c
}

/// Runs `sql`, failing the test when psql does; the rows, each a list of fields (NULL reads
/// as the empty string).
pub fn query(url: &str, sql: &str) -> Vec<Vec<String>> {
    let out = psql_command(url, sql).output().unwrap();
    assert!(
        out.status.success(),
        "psql {sql:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| l.split('\u{1f}').map(str::to_string).collect())
        .collect()
}

/// The single value `sql` returns.
pub fn scalar(url: &str, sql: &str) -> String {
    let rows = query(url, sql);
    assert_eq!(rows.len(), 1, "{sql:?} returns one row: {rows:?}");
    rows[0][0].clone()
}

/// A table name no other test (or run of this one) uses: lower case, so it reads the same
/// quoted or not.
pub fn table(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{name}_{}_{nanos}", std::process::id())
}

/// `url` with another password.
pub fn with_password(url: &str, password: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a postgres:// URL");
    let (userinfo, host) = rest.split_once('@').expect("a URL with user and password");
    let user = userinfo.split(':').next().unwrap();
    format!("{scheme}://{user}:{password}@{host}")
}
