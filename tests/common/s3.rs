//! The S3-compatible server the object-store tests run against: S3Proxy from `scripts/s3.sh`
//! (signed requests only, conditional puts as S3 has them), read and written here through
//! `riffle_storage`'s `Location`, a client of its own.

use std::path::{Path, PathBuf};
use std::process::Command;

use riffle_dataflow::checkpoint::{Location, StoreOptions};

const HOW: &str = "start one with `scripts/s3.sh start` and `eval \"$(scripts/s3.sh env)\"` \
                   (scripts/test.sh does both)";

/// `RIFFLE_S3_BUCKET` of the server `AWS_ENDPOINT_URL` names, set by `scripts/test.sh` after
/// `scripts/s3.sh start`. Fails (never skips) when unset or unreachable, saying how to start
/// one.
pub fn bucket() -> String {
    for var in [
        "AWS_ENDPOINT_URL",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "RIFFLE_S3_BUCKET",
    ] {
        if std::env::var(var).is_err() {
            panic!("{var} is not set: {HOW}");
        }
    }
    let bucket = std::env::var("RIFFLE_S3_BUCKET").unwrap();
    let at = location(&format!("s3://{bucket}/reachable"), None);
    if let Err(e) = at.list("") {
        panic!("no S3 server answers at AWS_ENDPOINT_URL ({e}): {HOW}");
    }
    bucket
}

/// A prefix of `bucket` no other test (or test run) uses: `s3://bucket/tests/NAME-PID-NANOS`.
pub fn fresh_url(bucket: &str, name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("s3://{bucket}/tests/{name}-{}-{nanos}", std::process::id())
}

/// `url` opened with the environment's credentials, at `endpoint` instead of
/// `AWS_ENDPOINT_URL` when given.
pub fn location(url: &str, endpoint: Option<&str>) -> Location {
    let options = StoreOptions {
        endpoint: endpoint.map(String::from),
        timeout_s: Some(5),
        ..StoreOptions::default()
    };
    Location::parse(url, &options).unwrap()
}

/// The checkpoint objects under `at`, oldest first.
pub fn checkpoints(at: &Location) -> Vec<String> {
    at.list("epoch-")
        .unwrap()
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| name.ends_with(".ckpt"))
        .collect()
}

/// A server of the test's own (`scripts/s3.sh` on a free port, its data in a temporary
/// folder), for tests that stop it mid-run; stopped when dropped. Its credentials are the
/// script's defaults, the same as the shared server's.
pub struct OwnServer {
    port: u16,
    dir: PathBuf,
}

impl OwnServer {
    pub fn start(dir: &Path) -> OwnServer {
        // Checks the shared server's environment too: the credentials come from there.
        bucket();
        let server = OwnServer {
            // Below the ephemeral range: no client connection takes it while the server is
            // stopped, so `resume` finds it free.
            port: crate::common::free_port_pair(),
            dir: dir.to_path_buf(),
        };
        server.script("start");
        server
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Stops the server (connections are refused until [`Self::resume`]).
    pub fn stop(&self) {
        self.script("stop");
    }

    /// Starts it again on the data it had.
    pub fn resume(&self) {
        self.script("resume");
    }

    /// The server's pid (to pause it: a store that hangs instead of refusing).
    pub fn pid(&self) -> u32 {
        self.script("pid").trim().parse().unwrap()
    }

    fn script(&self, command: &str) -> String {
        let out = Command::new(crate::common::repo().join("scripts/s3.sh"))
            .arg(command)
            .env("RIFFLE_S3_PORT", self.port.to_string())
            .env("RIFFLE_S3_DIR", &self.dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "scripts/s3.sh {command} (port {}): {}{}",
            self.port,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = Command::new(crate::common::repo().join("scripts/s3.sh"))
            .arg("stop")
            .env("RIFFLE_S3_PORT", self.port.to_string())
            .env("RIFFLE_S3_DIR", &self.dir)
            .output();
    }
}
