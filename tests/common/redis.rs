//! The Redis server the Redis sink's tests run against, read back with `redis-cli` (Debian's
//! `redis-tools`), a client independent of the sink's.

use std::collections::BTreeMap;
use std::process::Command;

/// `RIFFLE_REDIS_URL`, set by `scripts/test.sh` after `scripts/redis.sh start`, with database
/// `db` instead of its own. Fails (never skips) when unset or unreachable, saying how to start
/// one.
pub fn url(db: u32) -> String {
    let how = "start one with `scripts/redis.sh start` and `eval \"$(scripts/redis.sh env)\"` \
               (scripts/test.sh does both)";
    let url = std::env::var("RIFFLE_REDIS_URL")
        .unwrap_or_else(|_| panic!("RIFFLE_REDIS_URL is not set: {how}"));
    let base = match url.rsplit_once('/') {
        Some((base, db)) if db.chars().all(|c| c.is_ascii_digit()) && base.contains("://") => base,
        _ => url.as_str(),
    };
    let url = format!("{}/{db}", base.trim_end_matches('/'));
    let pong = redis_cli(&url, &["PING"]);
    let answer = String::from_utf8_lossy(&pong.stdout);
    assert!(
        answer.trim() == "PONG",
        "no Redis server answers at RIFFLE_REDIS_URL ({}{}): {how}",
        answer.trim(),
        String::from_utf8_lossy(&pong.stderr).trim()
    );
    url
}

/// `redis-cli ARGS` against `url`, its standard output (raw replies, one a line).
pub fn cli(url: &str, args: &[&str]) -> String {
    let out = redis_cli(url, args);
    assert!(
        out.status.success(),
        "redis-cli {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// redis-cli with the URL's password in `REDISCLI_AUTH` (redis-cli 7.0's `-u` sends an empty
/// user name for `redis://:pw@`, which the server refuses).
fn redis_cli(url: &str, args: &[&str]) -> std::process::Output {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let (userinfo, rest) = rest.rsplit_once('@').unwrap_or(("", rest));
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let (address, db) = rest.split_once('/').unwrap_or((rest, "0"));
    let (host, port) = address.rsplit_once(':').unwrap_or((address, "6379"));
    let db = if db.is_empty() { "0" } else { db };
    let mut command = Command::new("redis-cli");
    command
        .args(["--raw", "-h", host, "-p", port, "-n", db])
        .env("REDISCLI_AUTH", password);
    if !user.is_empty() {
        command.args(["--user", user]);
    }
    command.args(args).output().unwrap_or_else(|e| {
        panic!("running redis-cli ({e}): apt-get install redis-tools (scripts/redis.sh does)")
    })
}

/// Every key matching `pattern` with its value: `redis-cli --scan`, then one `MGET`.
pub fn dump(url: &str, pattern: &str) -> BTreeMap<String, String> {
    let listed = cli(url, &["--scan", "--pattern", pattern]);
    let mut keys: Vec<&str> = listed.lines().filter(|k| !k.is_empty()).collect();
    keys.sort_unstable();
    keys.dedup();
    if keys.is_empty() {
        return BTreeMap::new();
    }
    let mget = [&["MGET"][..], &keys].concat();
    let values = cli(url, &mget);
    let values: Vec<&str> = values.lines().collect();
    assert_eq!(values.len(), keys.len(), "one value per key: {values:?}");
    keys.iter()
        .zip(values)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A key prefix no other test run uses.
pub fn prefix(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("t{}-{nanos}-{name}", std::process::id())
}
