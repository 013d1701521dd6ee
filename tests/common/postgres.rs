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

/// What `scripts/postgres.sh env` says of the server's TLS.
pub struct Tls {
    /// The CA that signed the server's certificate.
    pub ca: PathBuf,
    /// `postgres://riffle_tls:…@127.0.0.1:PORT/riffle`: a user the server refuses without TLS.
    pub url: String,
    /// The client certificate and key of `riffle_cert`, who logs in with them alone.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl Tls {
    /// `host:port` of the server.
    pub fn address(&self) -> &str {
        let rest = self
            .url
            .split_once('@')
            .expect("a URL with user and password")
            .1;
        rest.split('/').next().unwrap()
    }

    /// The port of the server.
    pub fn port(&self) -> &str {
        self.address().rsplit(':').next().unwrap()
    }

    /// The password of `riffle_tls`.
    pub fn password(&self) -> &str {
        let userinfo = self
            .url
            .split_once("://")
            .unwrap()
            .1
            .split('@')
            .next()
            .unwrap();
        userinfo.split_once(':').expect("a URL with a password").1
    }
}

/// The server's TLS settings; fails (never skips) when the environment lacks them, as it does
/// for a server started by an older scripts/postgres.sh.
pub fn tls() -> Tls {
    url();
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!(
                "{name} is not set: `eval \"$(scripts/postgres.sh env)\"` sets it, for a \
                 server that scripts/postgres.sh started with TLS (scripts/test.sh does both)"
            )
        })
    };
    let tls = Tls {
        ca: var("RIFFLE_PG_CA").into(),
        url: var("RIFFLE_PG_TLS_URL"),
        client_cert: var("RIFFLE_PG_CLIENT_CERT").into(),
        client_key: var("RIFFLE_PG_CLIENT_KEY").into(),
    };
    assert!(
        tls.ca.is_file(),
        "RIFFLE_PG_CA {} is not a file: the server was started without TLS (by an older \
         scripts/postgres.sh); `scripts/postgres.sh stop` and `start` it again",
        tls.ca.display()
    );
    tls
}

/// A CA certificate of our own (`openssl`), which signed nothing the server holds.
pub fn unrelated_ca(dir: &std::path::Path) -> PathBuf {
    let ca = dir.join("unrelated-ca.pem");
    let out = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
        .args(["-subj", "/CN=not the server's CA", "-keyout"])
        .arg(dir.join("unrelated-ca.key"))
        .arg("-out")
        .arg(&ca)
        .output()
        .expect("running openssl (apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ca
}
