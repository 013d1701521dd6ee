use super::config::base64;
use super::http::MEDIA_TYPE;
use super::*;
use crate::schema_registry::{SchemaLookup, SubjectStrategy};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// A request as the scripted server saw it.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// (method, path, answers in order).
type Script<'a> = &'a [(&'a str, &'a str, &'a [(u16, &'a str)])];
type Answers = HashMap<(String, String), VecDeque<(u16, String)>>;

/// An HTTP/1.1 server on 127.0.0.1 answering (method, path) from a script: each answer
/// once, the last one for good; unscripted requests get a plain 404.
struct Server {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
}

impl Server {
    fn start(script: Script<'_>) -> Server {
        let mut answers = Answers::new();
        for (method, path, replies) in script {
            answers.insert(
                (method.to_string(), path.to_string()),
                replies.iter().map(|(s, b)| (*s, b.to_string())).collect(),
            );
        }
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen_in, stop_in) = (Arc::clone(&seen), Arc::clone(&stop));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop_in.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(stream) = stream {
                    serve(stream, &mut answers, &seen_in);
                }
            }
        });
        Server { addr, seen, stop }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(stream: TcpStream, answers: &mut Answers, seen: &Mutex<Vec<Seen>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let path = parts.next().unwrap_or_default().to_string();
    let mut headers = Vec::new();
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).unwrap();
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':').unwrap();
        headers.push((name.trim().to_string(), value.trim().to_string()));
    }
    let length = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .map_or(0, |(_, v)| v.parse::<usize>().unwrap());
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    let key = (method.clone(), path.clone());
    seen.lock().unwrap().push(Seen {
        method,
        path,
        headers,
        body: String::from_utf8(body).unwrap(),
    });
    let (status, body) = match answers.get_mut(&key) {
        Some(queue) if queue.len() > 1 => queue.pop_front().unwrap(),
        Some(queue) => queue.front().cloned().unwrap(),
        None => (404, "unscripted".to_string()),
    };
    let mut stream = stream;
    let _ = write!(
        stream,
        "HTTP/1.1 {status} Scripted\r\nContent-Type: {MEDIA_TYPE}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

fn config(url: &str) -> RegistryConfig {
    RegistryConfig {
        url: url.to_string(),
        subject: None,
        strategy: SubjectStrategy::default(),
        username: None,
        password: None,
        ca_file: None,
        timeout_ms: 2_000,
        auto_register: true,
    }
}

fn client(server: &Server) -> RegistryClient {
    RegistryClient::new(&config(&server.url())).unwrap()
}

const AVRO: &str = r#"{"schema": "{\"type\": \"string\"}"}"#;

#[test]
fn by_id_fetches_once_then_serves_from_cache() {
    let server = Server::start(&[("GET", "/schemas/ids/7", &[(200, AVRO)])]);
    let client = client(&server);
    let first = client.by_id(7).unwrap();
    let second = client.clone().by_id(7).unwrap();
    assert_eq!(first, second);
    assert_eq!(first.id, 7);
    assert_eq!(
        first.schema_type,
        SchemaType::Avro,
        "no schemaType means Avro"
    );
    assert_eq!(first.schema, r#"{"type": "string"}"#);
    assert!(first.references.is_empty());
    assert_eq!((first.subject.as_deref(), first.version), (None, None));
    let seen = server.seen();
    assert_eq!(
        seen.len(),
        1,
        "the second fetch comes from the cache: {seen:?}"
    );
    assert_eq!(seen[0].header("accept"), Some(MEDIA_TYPE));
    assert_eq!(seen[0].header("authorization"), None);
}

#[test]
fn protobuf_schema_type_and_references_parsed() {
    let body = r#"{"schema": "syntax = \"proto3\";", "schemaType": "PROTOBUF",
            "references": [{"name": "common.proto", "subject": "common", "version": 3}]}"#;
    let server = Server::start(&[("GET", "/schemas/ids/8", &[(200, body)])]);
    let schema = client(&server).by_id(8).unwrap();
    assert_eq!(schema.schema_type, SchemaType::Protobuf);
    assert_eq!(
        schema.references,
        vec![SchemaReference {
            name: "common.proto".into(),
            subject: "common".into(),
            version: 3
        }]
    );
}

fn version_body(subject: &str, version: i32, id: u32, refs: &[(&str, &str, i32)]) -> String {
    let refs: Vec<_> = refs
        .iter()
        .map(|(name, subject, version)| {
            serde_json::json!({"name": name, "subject": subject, "version": version})
        })
        .collect();
    serde_json::json!({
        "subject": subject, "version": version, "id": id,
        "schema": format!("// {subject} v{version}"), "schemaType": "PROTOBUF",
        "references": refs,
    })
    .to_string()
}

#[test]
fn references_resolved_transitively_dependencies_first() {
    // root -> b, a; a -> c, b; b -> c: c before b before a, each once.
    let a = version_body("a", 1, 11, &[("c.proto", "c", 1), ("b.proto", "b", 1)]);
    let b = version_body("b", 1, 12, &[("c.proto", "c", 1)]);
    let c = version_body("c", 1, 13, &[]);
    let server = Server::start(&[
        ("GET", "/subjects/a/versions/1", &[(200, &a)]),
        ("GET", "/subjects/b/versions/1", &[(200, &b)]),
        ("GET", "/subjects/c/versions/1", &[(200, &c)]),
    ]);
    let client = client(&server);
    let root = RegisteredSchema {
        id: 1,
        schema_type: SchemaType::Protobuf,
        schema: String::new(),
        references: vec![
            SchemaReference {
                name: "b.proto".into(),
                subject: "b".into(),
                version: 1,
            },
            SchemaReference {
                name: "a.proto".into(),
                subject: "a".into(),
                version: 1,
            },
        ],
        subject: None,
        version: None,
    };
    let resolved = SchemaLookup::references(&client, &root).unwrap();
    let names: Vec<_> = resolved.iter().map(|(n, s)| (n.as_str(), s.id)).collect();
    assert_eq!(names, [("c.proto", 13), ("b.proto", 12), ("a.proto", 11)]);
    assert_eq!(resolved[0].1.subject.as_deref(), Some("c"));
    assert_eq!(
        server.seen().len(),
        3,
        "each (subject, version) fetched once"
    );
    // Versions are cached: resolving again asks nothing.
    SchemaLookup::references(&client, &root).unwrap();
    assert_eq!(server.seen().len(), 3);
}

#[test]
fn reference_cycles_are_cut() {
    // root (x v1) -> y; y -> x (the root), z; z -> y.
    let y = version_body("y", 1, 21, &[("x.proto", "x", 1), ("z.proto", "z", 1)]);
    let z = version_body("z", 1, 22, &[("y.proto", "y", 1)]);
    let server = Server::start(&[
        ("GET", "/subjects/y/versions/1", &[(200, &y)]),
        ("GET", "/subjects/z/versions/1", &[(200, &z)]),
    ]);
    let root = RegisteredSchema {
        id: 20,
        schema_type: SchemaType::Protobuf,
        schema: String::new(),
        references: vec![SchemaReference {
            name: "y.proto".into(),
            subject: "y".into(),
            version: 1,
        }],
        subject: Some("x".into()),
        version: Some(1),
    };
    let resolved = client(&server).references(&root).unwrap();
    let names: Vec<_> = resolved.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["z.proto", "y.proto"]);
}

#[test]
fn not_found_names_the_id_and_the_url_and_is_not_retried() {
    let server = Server::start(&[(
        "GET",
        "/schemas/ids/9",
        &[(
            404,
            r#"{"error_code": 40403, "message": "Schema 9 not found"}"#,
        )],
    )]);
    let err = client(&server).by_id(9).unwrap_err();
    assert!(matches!(err, RegistryError::NotFound { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("no schema with id 9"), "{text}");
    assert!(
        text.contains(&format!("{}/schemas/ids/9", server.url())),
        "{text}"
    );
    assert!(text.contains("Schema 9 not found"), "{text}");
    assert_eq!(server.seen().len(), 1);
}

#[test]
fn a_404_that_is_not_the_registrys_hints_at_the_url() {
    let server = Server::start(&[]);
    let err = client(&server).latest("t-value").unwrap_err();
    assert!(matches!(err, RegistryError::NotFound { .. }), "{err:?}");
    assert!(err.to_string().contains("base URL"), "{err}");
}

#[test]
fn server_errors_are_retried_until_one_succeeds() {
    let server = Server::start(&[(
        "GET",
        "/schemas/ids/3",
        &[
            (500, r#"{"error_code": 50001, "message": "store down"}"#),
            (200, AVRO),
        ],
    )]);
    let schema = client(&server).by_id(3).unwrap();
    assert_eq!(schema.id, 3);
    assert_eq!(server.seen().len(), 2);
}

#[test]
fn server_errors_give_up_at_the_timeout() {
    let server = Server::start(&[(
        "GET",
        "/schemas/ids/4",
        &[(503, r#"{"error_code": 50003, "message": "busy"}"#)],
    )]);
    let client = RegistryClient::new(&RegistryConfig {
        timeout_ms: 300,
        auto_register: true,
        ..config(&server.url())
    })
    .unwrap();
    let started = Instant::now();
    let err = client.by_id(4).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_millis(1_500),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(err, RegistryError::Request { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("HTTP 503: busy"), "{text}");
    assert!(
        text.contains(&format!("{}/schemas/ids/4", server.url())),
        "{text}"
    );
    // 50 + 100 ms of backoff fit in 300 ms, 200 more would not (2 on a slow machine).
    assert!((2..=3).contains(&server.seen().len()), "{text}");
}

#[test]
fn connection_failures_are_retried_then_reported() {
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let client = RegistryClient::new(&RegistryConfig {
        timeout_ms: 200,
        auto_register: true,
        ..config(&format!("http://{addr}/"))
    })
    .unwrap();
    let text = client.latest("t-value").unwrap_err().to_string();
    assert!(
        text.contains(&format!("http://{addr}/subjects/t-value/versions/latest")),
        "{text}"
    );
    assert!(text.contains("GET failed after"), "{text}");
    assert!(!text.contains("after 1 attempt"), "retried: {text}");
}

#[test]
fn client_errors_are_not_retried() {
    let server = Server::start(&[(
        "GET",
        "/subjects/t-value/versions/latest",
        &[(401, r#"{"error_code": 401, "message": "Unauthorized"}"#)],
    )]);
    let err = client(&server).latest("t-value").unwrap_err();
    assert!(matches!(err, RegistryError::Request { .. }), "{err:?}");
    assert!(err.to_string().contains("HTTP 401: Unauthorized"), "{err}");
    assert_eq!(server.seen().len(), 1);
}

#[test]
fn latest_is_not_cached_versions_are_and_subjects_are_encoded() {
    let body = version_body("a b/c", 2, 30, &[]);
    let server = Server::start(&[
        (
            "GET",
            "/subjects/a%20b%2Fc/versions/latest",
            &[(200, &body)],
        ),
        ("GET", "/subjects/a%20b%2Fc/versions/2", &[(200, &body)]),
    ]);
    let client = client(&server);
    let latest = client.latest("a b/c").unwrap();
    assert_eq!(
        (latest.id, latest.subject.as_deref(), latest.version),
        (30, Some("a b/c"), Some(2))
    );
    client.latest("a b/c").unwrap();
    assert_eq!(server.seen().len(), 2, "latest asks every time");
    assert_eq!(client.version("a b/c", 2).unwrap(), latest);
    client.version("a b/c", 2).unwrap();
    assert_eq!(server.seen().len(), 3, "a version is asked once");
}

#[test]
fn register_posts_the_schema_and_caches_its_id() {
    let server = Server::start(&[
        (
            "POST",
            "/subjects/t-value/versions",
            &[(200, r#"{"id": 42}"#)],
        ),
        (
            "POST",
            "/subjects/p-value/versions",
            &[(200, r#"{"id": 43}"#)],
        ),
    ]);
    let client = client(&server);
    let avro = r#"{"type": "string"}"#;
    assert_eq!(
        client
            .register("t-value", SchemaType::Avro, avro, &[])
            .unwrap(),
        42
    );
    assert_eq!(
        client
            .register("t-value", SchemaType::Avro, avro, &[])
            .unwrap(),
        42
    );
    let reference = SchemaReference {
        name: "common.proto".into(),
        subject: "common".into(),
        version: 1,
    };
    let proto = "syntax = \"proto3\";";
    let id = client
        .register(
            "p-value",
            SchemaType::Protobuf,
            proto,
            std::slice::from_ref(&reference),
        )
        .unwrap();
    assert_eq!(id, 43);
    let seen = server.seen();
    assert_eq!(seen.len(), 2, "the repeated register is cached: {seen:?}");
    assert_eq!(
        (seen[0].method.as_str(), seen[0].path.as_str()),
        ("POST", "/subjects/t-value/versions")
    );
    assert_eq!(seen[0].header("content-type"), Some(MEDIA_TYPE));
    let avro_body: serde_json::Value = serde_json::from_str(&seen[0].body).unwrap();
    assert_eq!(
        avro_body,
        serde_json::json!({"schema": avro}),
        "Avro omits type, refs"
    );
    let proto_body: serde_json::Value = serde_json::from_str(&seen[1].body).unwrap();
    assert_eq!(
        proto_body,
        serde_json::json!({"schema": proto, "schemaType": "PROTOBUF", "references": [
            {"name": "common.proto", "subject": "common", "version": 1}]})
    );
}

#[test]
fn an_incompatible_register_says_so() {
    let server = Server::start(&[(
        "POST",
        "/subjects/t-value/versions",
        &[(
            409,
            r#"{"error_code": 409, "message": "Schema being registered is incompatible with an earlier schema"}"#,
        )],
    )]);
    let err = client(&server)
        .register("t-value", SchemaType::Avro, r#""int""#, &[])
        .unwrap_err();
    assert!(matches!(err, RegistryError::Request { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("refuses it as incompatible with the subject's compatibility level"),
        "{text}"
    );
    assert!(
        text.contains("incompatible with an earlier schema"),
        "{text}"
    );
    assert!(text.contains("/subjects/t-value/versions"), "{text}");
    assert_eq!(server.seen().len(), 1, "not retried");
}

#[test]
fn lookup_finds_an_id_or_none() {
    let server = Server::start(&[
        (
            "POST",
            "/subjects/known",
            &[(
                200,
                r#"{"subject": "known", "id": 5, "version": 1, "schema": "\"int\""}"#,
            )],
        ),
        (
            "POST",
            "/subjects/unknown",
            &[(
                404,
                r#"{"error_code": 40401, "message": "Subject 'unknown' not found."}"#,
            )],
        ),
    ]);
    let client = client(&server);
    assert_eq!(
        client.lookup("known", SchemaType::Json, "{}").unwrap(),
        Some(5)
    );
    assert_eq!(
        client
            .lookup("unknown", SchemaType::Avro, "\"int\"")
            .unwrap(),
        None
    );
    let seen = server.seen();
    let body: serde_json::Value = serde_json::from_str(&seen[0].body).unwrap();
    assert_eq!(
        body,
        serde_json::json!({"schema": "{}", "schemaType": "JSON"})
    );
    // A found id is remembered for register too.
    assert_eq!(
        client
            .register("known", SchemaType::Json, "{}", &[])
            .unwrap(),
        5
    );
    assert_eq!(server.seen().len(), 2);
}

#[test]
fn basic_auth_is_sent_and_kept_out_of_debug() {
    let server = Server::start(&[("GET", "/schemas/ids/1", &[(200, AVRO)])]);
    let client = RegistryClient::new(&RegistryConfig {
        username: Some("user".into()),
        password: Some("s3cret".into()),
        ..config(&server.url())
    })
    .unwrap();
    client.by_id(1).unwrap();
    assert_eq!(
        server.seen()[0].header("authorization"),
        Some(format!("Basic {}", base64(b"user:s3cret")).as_str())
    );
    assert_eq!(base64(b"user:s3cret"), "dXNlcjpzM2NyZXQ=");
    assert!(!format!("{client:?}").contains("s3cret"));
}

#[test]
fn base64_pads() {
    let cases = [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg=="),
    ];
    for (plain, encoded) in cases {
        assert_eq!(base64(plain.as_bytes()), encoded);
    }
}

#[test]
fn subjects_by_strategy() {
    let mut c = config("http://registry:8081");
    assert_eq!(
        subject_for(&c, "clicks", Some("shop.Click")).unwrap(),
        "clicks-value"
    );
    c.strategy = SubjectStrategy::RecordName;
    assert_eq!(
        subject_for(&c, "clicks", Some("shop.Click")).unwrap(),
        "shop.Click"
    );
    c.strategy = SubjectStrategy::TopicRecordName;
    assert_eq!(
        subject_for(&c, "clicks", Some("shop.Click")).unwrap(),
        "clicks-shop.Click"
    );
    let err = subject_for(&c, "clicks", None).unwrap_err();
    assert!(matches!(err, RegistryError::Config(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("topic_record_name needs a record name"),
        "{err}"
    );
    c.strategy = SubjectStrategy::RecordName;
    assert!(subject_for(&c, "clicks", None)
        .unwrap_err()
        .to_string()
        .contains("record_name needs"));
    c.subject = Some("fixed".into());
    assert_eq!(subject_for(&c, "clicks", None).unwrap(), "fixed");
}

fn config_error(config: &RegistryConfig) -> String {
    match RegistryClient::new(config) {
        Err(RegistryError::Config(what)) => what,
        other => panic!("expected a config error, got {other:?}"),
    }
}

#[test]
fn bad_configs_name_the_field() {
    let text = config_error(&config("ftp://registry:8081"));
    assert!(text.contains("url") && text.contains("\"ftp\""), "{text}");
    assert!(config_error(&config("registry:8081")).contains("url"));
    assert!(config_error(&config("http://")).contains("url"));
    assert!(config_error(&config("http://u:p@registry")).contains("credentials"));
    let text = config_error(&RegistryConfig {
        username: Some("user".into()),
        ..config("http://registry")
    });
    assert!(text.contains("username is set without password"), "{text}");
    let text = config_error(&RegistryConfig {
        password: Some("pw".into()),
        ..config("http://registry")
    });
    assert!(text.contains("password is set without username"), "{text}");
    let text = config_error(&RegistryConfig {
        timeout_ms: 0,
        auto_register: true,
        ..config("http://registry")
    });
    assert!(text.contains("timeout_ms"), "{text}");
}

const TEST_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBmjCCAUGgAwIBAgIUVsDVFSPxzLf9vRTsJplIw9lQYEcwCgYIKoZIzj0EAwIw
IjEgMB4GA1UEAwwXcmlmZmxlIHJlZ2lzdHJ5IHRlc3QgQ0EwIBcNMjYxMjAyMTI0
MDA5WhgPMjEyNjExMDgxMjQwMDlaMCIxIDAeBgNVBAMMF3JpZmZsZSByZWdpc3Ry
eSB0ZXN0IENBMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEIiMiqScWrEhMuI4M
gEXMfvAEjqDz1347MY4wGj5cViJM49NYy3PibXJ4GbIk9hOh3niHWOc5RLhWO/xe
ysqL6KNTMFEwHQYDVR0OBBYEFH2OlyF41TjPb2VHeHAhgWuiIe3EMB8GA1UdIwQY
MBaAFH2OlyF41TjPb2VHeHAhgWuiIe3EMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZI
zj0EAwIDRwAwRAIge/P0CSmFZOWT4L89R7sqBti51r7UCUIeIQJqyM8UtvACICRI
i6aNmuiMZAhJVk00i2YP/LhZLwe2iU6x5eHCqzzz
-----END CERTIFICATE-----
";

#[test]
fn ca_file_must_hold_a_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let with = |path: &std::path::Path| RegistryConfig {
        ca_file: Some(path.to_path_buf()),
        ..config("https://registry:8081/apis/ccompat/v7/")
    };
    let missing = dir.path().join("missing.pem");
    let text = config_error(&with(&missing));
    assert!(
        text.contains("ca_file") && text.contains("missing.pem"),
        "{text}"
    );
    assert!(
        text.contains("expected a PEM file with the CA certificate"),
        "{text}"
    );

    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    assert!(config_error(&with(&empty)).contains("holds no certificate"));

    let garbage = dir.path().join("garbage.pem");
    std::fs::write(
        &garbage,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    assert!(config_error(&with(&garbage)).contains("cannot be used"));

    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, TEST_CA).unwrap();
    let client = RegistryClient::new(&with(&ca)).unwrap();
    assert_eq!(
        client.url(),
        "https://registry:8081/apis/ccompat/v7",
        "trailing / trimmed"
    );
}

/// A server certificate for 127.0.0.1 signed by `TEST_CA`, and its key.
const LEAF_CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBxjCCAW2gAwIBAgIUGVZYdz3jfyZUhnSHUaYEUpmlBWowCgYIKoZIzj0EAwIw
IjEgMB4GA1UEAwwXcmlmZmxlIHJlZ2lzdHJ5IHRlc3QgQ0EwIBcNMjYxMjAyMTI0
NTU3WhgPMjEyNjExMDgxMjQ1NTdaMBQxEjAQBgNVBAMMCWxvY2FsaG9zdDBZMBMG
ByqGSM49AgEGCCqGSM49AwEHA0IABLiTz3bpuPLwFGSv6rMUrnhyXjnukXbVoe6N
cqFqNhy0QKzzTUhXZiBxiWIwBjXR9XRZwvY5N7jMtwLxqpcXxHmjgYwwgYkwGgYD
VR0RBBMwEYIJbG9jYWxob3N0hwR/AAABMAkGA1UdEwQCMAAwCwYDVR0PBAQDAgeA
MBMGA1UdJQQMMAoGCCsGAQUFBwMBMB0GA1UdDgQWBBSI4DmVwrq123M1UpUzGbcu
7rSiUjAfBgNVHSMEGDAWgBR9jpcheNU4z29lR3hwIYFroiHtxDAKBggqhkjOPQQD
AgNHADBEAiBLGPQYgrwEc9utCG/gtOZmT/KipT68adc8ybMSQ1Wj3gIgS1mj7/22
549zftMO+4mXrhwf+UsOY6wz+nDvXXgrD5c=
-----END CERTIFICATE-----
";
const LEAF_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgaEbn0BHCn+AgJuxT
Xlw0xulRVh6RPqatnP+snyaTUK+hRANCAAS4k8926bjy8BRkr+qzFK54cl457pF2
1aHujXKhajYctECs801IV2YgcYliMAY10fV0WcL2OTe4zLcC8aqXF8R5
-----END PRIVATE KEY-----
";

#[test]
fn https_with_the_ca_file_verifies_the_registry() {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = Arc::new(
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from_pem_slice(LEAF_CERT.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(LEAF_KEY.as_bytes()).unwrap(),
            )
            .unwrap(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // Two connections: the client trusting the CA, then one trusting the system's roots.
    std::thread::spawn(move || {
        for tcp in listener.incoming().take(2).flatten() {
            let conn = rustls::ServerConnection::new(Arc::clone(&tls)).unwrap();
            let mut stream = rustls::StreamOwned::new(conn, tcp);
            let mut request = Vec::new();
            let mut buf = [0_u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{AVRO}",
                AVRO.len()
            );
            stream.conn.send_close_notify();
            let _ = stream.flush();
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, TEST_CA).unwrap();
    let url = format!("https://{addr}");
    let trusting = RegistryClient::new(&RegistryConfig {
        ca_file: Some(ca),
        ..config(&url)
    })
    .unwrap();
    assert_eq!(trusting.by_id(1).unwrap().schema, r#"{"type": "string"}"#);

    let system_roots = RegistryClient::new(&config(&url)).unwrap();
    let text = system_roots.by_id(1).unwrap_err().to_string();
    assert!(text.contains(&format!("{url}/schemas/ids/1")), "{text}");
    assert!(
        !text.contains("attempt"),
        "a certificate failure is not retried: {text}"
    );
}
