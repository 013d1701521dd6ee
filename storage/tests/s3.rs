//! `Location` against a real S3-compatible server (S3Proxy from `scripts/s3.sh`), taking
//! signed requests only. The server's address and credentials come from the environment
//! (`eval "$(scripts/s3.sh env)"`, as scripts/test.sh does); a test fails, never skips, when
//! they are missing or the server does not answer.

use std::time::{Duration, Instant};

use riffle_storage::{Location, StoreOptions};

const HOW: &str = "start one with `scripts/s3.sh start` and `eval \"$(scripts/s3.sh env)\"` \
                   (scripts/test.sh does both)";

/// `s3://$RIFFLE_S3_BUCKET/<a prefix no other test uses>`, checked to answer.
fn fresh(name: &str) -> Location {
    for var in ["AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "RIFFLE_S3_BUCKET"] {
        if std::env::var(var).is_err() {
            panic!("{var} is not set: {HOW}");
        }
    }
    let bucket = std::env::var("RIFFLE_S3_BUCKET").unwrap();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let url = format!(
        "s3://{bucket}/storage-tests/{name}-{}-{nanos}",
        std::process::id()
    );
    let at = Location::parse(&url, &StoreOptions::default()).unwrap();
    if let Err(e) = at.list("") {
        panic!("the S3 server does not answer ({e}): {HOW}");
    }
    at
}

#[test]
fn objects_are_written_read_listed_renamed_and_deleted() {
    let at = fresh("basics");
    assert!(!at.is_local());
    assert_eq!(at.get("a/one").unwrap(), None);
    at.put("a/one", b"1".to_vec()).unwrap();
    at.put("a/two", b"22".to_vec()).unwrap();
    at.put("b/three", b"333".to_vec()).unwrap();
    assert_eq!(at.get("a/one").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(
        at.list("a/").unwrap(),
        vec![("a/one".to_string(), 1), ("a/two".to_string(), 2)]
    );
    assert_eq!(at.list("a/t").unwrap(), vec![("a/two".to_string(), 2)]);
    at.rename("a/two", "b/two").unwrap();
    at.rename("a/two", "b/two").unwrap();
    assert!(!at.exists("a/two").unwrap());
    let b = at.child("b");
    assert_eq!(
        b.list("").unwrap(),
        vec![("three".to_string(), 3), ("two".to_string(), 2)]
    );
    b.delete("two").unwrap();
    b.delete("two").unwrap();
    assert_eq!(b.list("").unwrap(), vec![("three".to_string(), 3)]);
    // Keys are kept as written: a Hive folder `k=50%25` is listed, renamed and deleted by the
    // same name (not `k=50%2525`).
    at.put("k=50%25#x/f", b"4444".to_vec()).unwrap();
    assert_eq!(at.list("k=").unwrap(), vec![("k=50%25#x/f".to_string(), 4)]);
    at.rename("k=50%25#x/f", "k=50%25#x/g").unwrap();
    assert_eq!(
        at.get("k=50%25#x/g").unwrap().as_deref(),
        Some(&b"4444"[..])
    );
    at.delete("k=50%25#x/g").unwrap();
    assert!(at.list("k=").unwrap().is_empty());
}

#[test]
fn conditional_puts_never_overwrite_and_updates_need_the_version_seen() {
    let at = fresh("conditional");
    assert!(at.put_new("epoch-1", b"first".to_vec()).unwrap());
    assert!(
        !at.put_new("epoch-1", b"second".to_vec()).unwrap(),
        "If-None-Match: * refused on an existing key"
    );
    assert_eq!(at.get("epoch-1").unwrap().as_deref(), Some(&b"first"[..]));

    let v1 = at
        .put_new_versioned("lease", b"a".to_vec())
        .unwrap()
        .unwrap();
    let (bytes, seen) = at.get_versioned("lease").unwrap().unwrap();
    assert_eq!((&bytes[..], &seen), (&b"a"[..], &v1));
    let v2 = at
        .put_if_match("lease", b"b".to_vec(), &v1)
        .unwrap()
        .unwrap();
    assert_ne!(v1, v2);
    assert_eq!(
        at.put_if_match("lease", b"c".to_vec(), &v1).unwrap(),
        None,
        "a stale version is refused (If-Match)"
    );
    assert_eq!(at.get("lease").unwrap().as_deref(), Some(&b"b"[..]));
    at.delete("lease").unwrap();
    assert_eq!(at.put_if_match("lease", b"d".to_vec(), &v2).unwrap(), None);
    assert!(!at.exists("lease").unwrap());
}

#[test]
fn a_refused_signature_names_the_url_and_the_operation() {
    let good = fresh("credentials");
    let options = StoreOptions {
        secret_access_key: Some("not-the-secret".into()),
        ..StoreOptions::default()
    };
    let bad = Location::parse(good.url(), &options).unwrap();
    let e = bad.put("x", b"x".to_vec()).unwrap_err().to_string();
    assert!(e.starts_with(&format!("writing {}/x: ", good.url())), "{e}");
    assert!(!good.exists("x").unwrap(), "nothing was written");
}

#[test]
fn a_store_that_is_down_fails_within_its_timeout() {
    // A port nothing listens on: the connection is refused at once, and the retries stop
    // within `timeout_s`.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let options = StoreOptions {
        endpoint: Some(format!("http://127.0.0.1:{port}")),
        timeout_s: Some(2),
        ..StoreOptions::default()
    };
    let at = Location::parse("s3://riffle-test/down", &options).unwrap();
    let started = Instant::now();
    let e = at
        .put_new("epoch-1", b"x".to_vec())
        .unwrap_err()
        .to_string();
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    assert!(
        e.starts_with("writing (if absent) s3://riffle-test/down/epoch-1: "),
        "{e}"
    );
}
