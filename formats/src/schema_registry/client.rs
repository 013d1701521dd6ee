//! The blocking HTTP client of a registry that serves the Confluent REST contract.
//!
//! Blocking (ureq) because it is called from source and sink set-up and from worker threads,
//! sometimes inside a tokio runtime, where a blocking client that starts its own runtime would
//! panic. Schemas by id and by (subject, version) are immutable, so they are cached forever;
//! registrations are cached by (subject, type, text) so encoders can register freely.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use ureq::http::Uri;
use ureq::tls::{RootCerts, TlsConfig};

use super::{
    RegisteredSchema, RegistryConfig, RegistryError, SchemaLookup, SchemaReference, SchemaType,
    SubjectStrategy,
};

/// The registry's media type, sent as Content-Type and Accept.
const MEDIA_TYPE: &str = "application/vnd.schemaregistry.v1+json";
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Longest part of a non-JSON error body quoted in an error.
const QUOTED_BODY_CHARS: usize = 200;

/// A client of one schema registry: cheap to clone (an `Arc` inside) and shared across threads.
#[derive(Clone, Debug)]
pub struct RegistryClient {
    inner: Arc<Inner>,
}

struct Inner {
    /// The base URL without a trailing `/`.
    base: String,
    agent: ureq::Agent,
    /// `Basic …`, sent on every request.
    authorization: Option<String>,
    /// The longest a call may take, retries included.
    timeout: Duration,
    by_id: RwLock<HashMap<u32, Arc<RegisteredSchema>>>,
    by_version: RwLock<HashMap<(String, i32), Arc<RegisteredSchema>>>,
    registered: RwLock<HashMap<(String, SchemaType, String), u32>>,
}

// By hand so the credentials stay out of logs.
impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inner")
            .field("url", &self.base)
            .field("basic_auth", &self.authorization.is_some())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The HTTP method of a request, with the body of a POST.
#[derive(Clone, Copy)]
enum Method<'a> {
    Get,
    Post(&'a str),
}

impl Method<'_> {
    fn name(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post(_) => "POST",
        }
    }
}

/// A final answer (2xx or 4xx) of the registry.
struct Reply {
    status: u16,
    body: String,
}

/// A schema as the registry answers it (`/schemas/ids/{id}` has no subject, version or id).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SchemaBody {
    #[serde(default)]
    subject: Option<String>,
    #[serde(default)]
    version: Option<i32>,
    #[serde(default)]
    id: Option<u32>,
    schema: String,
    #[serde(default)]
    schema_type: Option<SchemaType>,
    #[serde(default)]
    references: Option<Vec<SchemaReference>>,
}

#[derive(Deserialize)]
struct IdBody {
    id: u32,
}

/// The registry's error body (`{"error_code": 40401, "message": "…"}`).
#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    message: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SchemaRequest<'a> {
    schema: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    schema_type: Option<SchemaType>,
    #[serde(skip_serializing_if = "<[SchemaReference]>::is_empty")]
    references: &'a [SchemaReference],
}

impl RegistryClient {
    /// A client of the registry `config` names. Checks the URL (http or https, with a host, no
    /// credentials or query), that `username` and `password` come together, that `ca_file`
    /// holds a PEM certificate (then the only CA trusted) and that `timeout_ms` is positive.
    pub fn new(config: &RegistryConfig) -> Result<Self, RegistryError> {
        let base = check_url(&config.url)?;
        if config.timeout_ms == 0 {
            return Err(RegistryError::Config(
                "timeout_ms is 0: expected the longest wait for a request in milliseconds (> 0)"
                    .into(),
            ));
        }
        let authorization = match (&config.username, &config.password) {
            (Some(user), Some(password)) => Some(format!(
                "Basic {}",
                base64(format!("{user}:{password}").as_bytes())
            )),
            (None, None) => None,
            (Some(_), None) => {
                return Err(RegistryError::Config(
                    "username is set without password: expected both (basic auth) or neither"
                        .into(),
                ))
            }
            (None, Some(_)) => {
                return Err(RegistryError::Config(
                    "password is set without username: expected both (basic auth) or neither"
                        .into(),
                ))
            }
        };
        let mut agent = ureq::Agent::config_builder()
            // Statuses are read, not raised: 404s and the registry's messages matter.
            .http_status_as_error(false)
            .user_agent(concat!("riffle/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = &config.ca_file {
            let roots = crate::web::read_ca_file(path)
                .map_err(|m| RegistryError::Config(format!("ca_file {m}")))?;
            agent = agent.tls_config(
                TlsConfig::builder()
                    .root_certs(RootCerts::new_with_certs(&roots))
                    .build(),
            );
        }
        Ok(Self {
            inner: Arc::new(Inner {
                base,
                agent: agent.build().new_agent(),
                authorization,
                timeout: Duration::from_millis(config.timeout_ms),
                by_id: RwLock::default(),
                by_version: RwLock::default(),
                registered: RwLock::default(),
            }),
        })
    }

    /// The registry's base URL, without a trailing `/`.
    pub fn url(&self) -> &str {
        &self.inner.base
    }

    /// The schema registered with `id` (`GET /schemas/ids/{id}`), cached forever.
    pub fn by_id(&self, id: u32) -> Result<Arc<RegisteredSchema>, RegistryError> {
        if let Some(found) = read(&self.inner.by_id).get(&id) {
            return Ok(Arc::clone(found));
        }
        let url = format!("{}/schemas/ids/{id}", self.inner.base);
        let reply = self.send(Method::Get, &url)?;
        match reply.status {
            200..=299 => {
                let body: SchemaBody = parse(&reply, Method::Get, &url)?;
                let schema = Arc::new(registered(body, Some(id), Method::Get, &url)?);
                write(&self.inner.by_id).insert(id, Arc::clone(&schema));
                Ok(schema)
            }
            404 => Err(not_found(&reply, url, format!("no schema with id {id}"))),
            _ => Err(status_error(&reply, Method::Get, url, None)),
        }
    }

    /// The latest version of `subject` (`GET /subjects/{subject}/versions/latest`), not cached.
    pub fn latest(&self, subject: &str) -> Result<Arc<RegisteredSchema>, RegistryError> {
        self.fetch_version(subject, "latest", || {
            format!("no version of subject {subject:?}")
        })
        .map(Arc::new)
    }

    /// Version `version` of `subject` (`GET /subjects/{subject}/versions/{version}`), cached
    /// forever (a negative version, the latest, is not cached).
    pub fn version(
        &self,
        subject: &str,
        version: i32,
    ) -> Result<Arc<RegisteredSchema>, RegistryError> {
        let key = (subject.to_string(), version);
        if let Some(found) = read(&self.inner.by_version).get(&key) {
            return Ok(Arc::clone(found));
        }
        let schema = Arc::new(self.fetch_version(subject, &version.to_string(), || {
            format!("subject {subject:?} has no version {version}")
        })?);
        if version > 0 {
            write(&self.inner.by_version).insert(key, Arc::clone(&schema));
        }
        Ok(schema)
    }

    fn fetch_version(
        &self,
        subject: &str,
        version: &str,
        missing: impl FnOnce() -> String,
    ) -> Result<RegisteredSchema, RegistryError> {
        let url = format!(
            "{}/subjects/{}/versions/{version}",
            self.inner.base,
            path_segment(subject)
        );
        let reply = self.send(Method::Get, &url)?;
        match reply.status {
            200..=299 => {
                let body: SchemaBody = parse(&reply, Method::Get, &url)?;
                registered(body, None, Method::Get, &url)
            }
            404 => Err(not_found(&reply, url, missing())),
            _ => Err(status_error(&reply, Method::Get, url, None)),
        }
    }

    /// Registers `schema` under `subject` (`POST /subjects/{subject}/versions`) and returns its
    /// id; the registry answers the existing id when the schema is already registered.
    /// Cached by (subject, type, text), so registering again costs nothing.
    pub fn register(
        &self,
        subject: &str,
        schema_type: SchemaType,
        schema: &str,
        references: &[SchemaReference],
    ) -> Result<u32, RegistryError> {
        let key = (subject.to_string(), schema_type, schema.to_string());
        if let Some(id) = read(&self.inner.registered).get(&key) {
            return Ok(*id);
        }
        let url = format!(
            "{}/subjects/{}/versions",
            self.inner.base,
            path_segment(subject)
        );
        let body = request_body(schema_type, schema, references, &url)?;
        let method = Method::Post(&body);
        let reply = self.send(method, &url)?;
        match reply.status {
            200..=299 => {
                let IdBody { id } = parse(&reply, method, &url)?;
                write(&self.inner.registered).insert(key, id);
                Ok(id)
            }
            409 => Err(status_error(
                &reply,
                method,
                url,
                Some(&format!(
                    "registering a new version of subject {subject:?}: the registry refuses it \
                     as incompatible with the subject's compatibility level"
                )),
            )),
            422 => Err(status_error(
                &reply,
                method,
                url,
                Some(&format!(
                    "registering under subject {subject:?}: the registry rejects the \
                     {schema_type:?} schema as invalid"
                )),
            )),
            _ => Err(status_error(&reply, method, url, None)),
        }
    }

    /// The id of `schema` if it is registered under `subject` (`POST /subjects/{subject}`),
    /// `None` when the subject or the schema is unknown (404). Found ids are cached with
    /// [`register`](Self::register)'s.
    pub fn lookup(
        &self,
        subject: &str,
        schema_type: SchemaType,
        schema: &str,
    ) -> Result<Option<u32>, RegistryError> {
        let key = (subject.to_string(), schema_type, schema.to_string());
        if let Some(id) = read(&self.inner.registered).get(&key) {
            return Ok(Some(*id));
        }
        let url = format!("{}/subjects/{}", self.inner.base, path_segment(subject));
        let body = request_body(schema_type, schema, &[], &url)?;
        let method = Method::Post(&body);
        let reply = self.send(method, &url)?;
        match reply.status {
            200..=299 => {
                let IdBody { id } = parse(&reply, method, &url)?;
                write(&self.inner.registered).insert(key, id);
                Ok(Some(id))
            }
            404 => Ok(None),
            _ => Err(status_error(&reply, method, url, None)),
        }
    }

    /// Sends one request, retrying connection errors, timeouts and 5xx with backoff until the
    /// timeout has passed since the call started. Returns the first 2xx–4xx answer.
    fn send(&self, method: Method<'_>, url: &str) -> Result<Reply, RegistryError> {
        let started = Instant::now();
        let deadline = started + self.inner.timeout;
        let mut backoff = FIRST_BACKOFF;
        let mut attempts = 0_u32;
        loop {
            attempts += 1;
            let remaining = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            let failure = match self.attempt(method, url, remaining) {
                Ok(reply) if reply.status < 500 => return Ok(reply),
                Ok(reply) => format!("HTTP {}{}", reply.status, registry_says(&reply)),
                Err(e) if crate::web::retryable(&e) => e.to_string(),
                Err(e) => {
                    return Err(RegistryError::Request {
                        url: url.to_string(),
                        what: format!("{} failed: {e}", method.name()),
                    })
                }
            };
            if Instant::now() + backoff >= deadline {
                return Err(RegistryError::Request {
                    url: url.to_string(),
                    what: format!(
                        "{} failed after {attempts} attempt(s) in {} ms (timeout_ms {}): {failure}",
                        method.name(),
                        started.elapsed().as_millis(),
                        self.inner.timeout.as_millis()
                    ),
                });
            }
            tracing::debug!(url, attempts, %failure, "schema registry request failed; retrying");
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    fn attempt(
        &self,
        method: Method<'_>,
        url: &str,
        timeout: Duration,
    ) -> Result<Reply, ureq::Error> {
        let agent = &self.inner.agent;
        let mut response = match method {
            Method::Get => self.prepare(agent.get(url), timeout).call()?,
            Method::Post(body) => self
                .prepare(agent.post(url), timeout)
                .content_type(MEDIA_TYPE)
                .send(body)?,
        };
        let status = response.status().as_u16();
        let body = response.body_mut().read_to_string()?;
        Ok(Reply { status, body })
    }

    fn prepare<B>(
        &self,
        request: ureq::RequestBuilder<B>,
        timeout: Duration,
    ) -> ureq::RequestBuilder<B> {
        let request = request
            .config()
            .timeout_global(Some(timeout))
            .build()
            .header("accept", MEDIA_TYPE);
        match &self.inner.authorization {
            Some(auth) => request.header("authorization", auth.as_str()),
            None => request,
        }
    }
}

impl SchemaLookup for RegistryClient {
    fn by_id(&self, id: u32) -> Result<Arc<RegisteredSchema>, RegistryError> {
        RegistryClient::by_id(self, id)
    }

    /// Resolves references through [`RegistryClient::version`], depth first: dependencies
    /// before dependents, each (subject, version) and each name once, cycles cut.
    fn references(
        &self,
        schema: &RegisteredSchema,
    ) -> Result<Vec<(String, Arc<RegisteredSchema>)>, RegistryError> {
        let mut walk = Walk::default();
        if let (Some(subject), Some(version)) = (&schema.subject, schema.version) {
            walk.visiting.insert((subject.clone(), version));
        }
        for reference in &schema.references {
            self.visit(reference, &mut walk)?;
        }
        Ok(walk.out)
    }
}

/// The state of a reference walk.
#[derive(Default)]
struct Walk {
    out: Vec<(String, Arc<RegisteredSchema>)>,
    done: HashSet<(String, i32)>,
    visiting: HashSet<(String, i32)>,
    names: HashSet<String>,
}

impl RegistryClient {
    fn visit(&self, reference: &SchemaReference, walk: &mut Walk) -> Result<(), RegistryError> {
        let key = (reference.subject.clone(), reference.version);
        // Already emitted, or on the current path (a cycle): cut here.
        if walk.done.contains(&key) || !walk.visiting.insert(key.clone()) {
            return Ok(());
        }
        let schema = self.version(&reference.subject, reference.version)?;
        for child in &schema.references {
            self.visit(child, walk)?;
        }
        walk.visiting.remove(&key);
        walk.done.insert(key);
        if walk.names.insert(reference.name.clone()) {
            walk.out.push((reference.name.clone(), schema));
        } else {
            tracing::warn!(
                name = %reference.name,
                subject = %reference.subject,
                version = reference.version,
                "schema reference name already resolved to another schema; keeping the first"
            );
        }
        Ok(())
    }
}

/// The subject of a topic's value schema: `subject` when set, else by `strategy`
/// (`<topic>-value`, `<record>`, `<topic>-<record>`); the record strategies need the record's
/// full name.
pub fn subject_for(
    config: &RegistryConfig,
    topic: &str,
    record_full_name: Option<&str>,
) -> Result<String, RegistryError> {
    if let Some(subject) = &config.subject {
        if subject.is_empty() {
            return Err(RegistryError::Config(
                "subject is empty: expected a subject name or no `subject` (named by strategy)"
                    .into(),
            ));
        }
        return Ok(subject.clone());
    }
    let record = record_full_name.filter(|r| !r.is_empty());
    match (config.strategy, record) {
        (SubjectStrategy::TopicName, _) => Ok(format!("{topic}-value")),
        (SubjectStrategy::RecordName, Some(record)) => Ok(record.to_string()),
        (SubjectStrategy::TopicRecordName, Some(record)) => Ok(format!("{topic}-{record}")),
        (strategy, None) => Err(RegistryError::Config(format!(
            "strategy {} needs a record name, and topic {topic:?}'s schema has none known: \
             expected `subject` or a declared schema with a record name",
            match strategy {
                SubjectStrategy::RecordName => "record_name",
                _ => "topic_record_name",
            }
        ))),
    }
}

/// The base URL, checked and without trailing `/`s.
fn check_url(url: &str) -> Result<String, RegistryError> {
    let invalid = |why: &str| {
        RegistryError::Config(format!(
            "url {url:?} {why}: expected the registry's base URL, like http://host:8081"
        ))
    };
    let uri: Uri = url
        .parse()
        .map_err(|e| invalid(&format!("is not a URL ({e})")))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        Some(other) => return Err(invalid(&format!("has scheme {other:?}, not http or https"))),
        None => return Err(invalid("has no scheme (http:// or https://)")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(invalid("has no host"));
    }
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err(RegistryError::Config(
            "url holds credentials (user:password@): expected them in username and password, \
             which stay out of logs"
                .into(),
        ));
    }
    if uri.query().is_some() {
        return Err(invalid("has a query (?…)"));
    }
    Ok(url.trim_end_matches('/').to_string())
}

fn request_body(
    schema_type: SchemaType,
    schema: &str,
    references: &[SchemaReference],
    url: &str,
) -> Result<String, RegistryError> {
    serde_json::to_string(&SchemaRequest {
        schema,
        schema_type: (schema_type != SchemaType::Avro).then_some(schema_type),
        references,
    })
    .map_err(|e| RegistryError::Request {
        url: url.to_string(),
        what: format!("cannot encode the request body: {e}"),
    })
}

fn parse<T: serde::de::DeserializeOwned>(
    reply: &Reply,
    method: Method<'_>,
    url: &str,
) -> Result<T, RegistryError> {
    serde_json::from_str(&reply.body).map_err(|e| RegistryError::Request {
        url: url.to_string(),
        what: format!(
            "{} answered HTTP {} with a body that is not the registry's JSON ({e}): {}",
            method.name(),
            reply.status,
            quote(&reply.body)
        ),
    })
}

fn registered(
    body: SchemaBody,
    id: Option<u32>,
    method: Method<'_>,
    url: &str,
) -> Result<RegisteredSchema, RegistryError> {
    let id = id.or(body.id).ok_or_else(|| RegistryError::Request {
        url: url.to_string(),
        what: format!("{} answered a schema without an `id`", method.name()),
    })?;
    Ok(RegisteredSchema {
        id,
        schema_type: body.schema_type.unwrap_or_default(),
        schema: body.schema,
        references: body.references.unwrap_or_default(),
        subject: body.subject,
        version: body.version,
    })
}

fn not_found(reply: &Reply, url: String, what: String) -> RegistryError {
    let detail = match error_message(&reply.body) {
        Some(message) => format!(" (registry: {message})"),
        // A 404 without the registry's error body is likely a wrong base URL.
        None => " (HTTP 404 without a registry error: is url the registry's base URL?)".into(),
    };
    RegistryError::NotFound {
        url,
        what: format!("{what}{detail}"),
    }
}

fn status_error(
    reply: &Reply,
    method: Method<'_>,
    url: String,
    context: Option<&str>,
) -> RegistryError {
    let context = context.map(|c| format!(": {c}")).unwrap_or_default();
    RegistryError::Request {
        url,
        what: format!(
            "{} failed: HTTP {}{context}{}",
            method.name(),
            reply.status,
            registry_says(reply)
        ),
    }
}

/// `: <the registry's message>`, or a quote of a body that is not the registry's.
fn registry_says(reply: &Reply) -> String {
    match error_message(&reply.body) {
        Some(message) => format!(": {message}"),
        None if reply.body.trim().is_empty() => String::new(),
        None => format!(": {}", quote(&reply.body)),
    }
}

fn error_message(body: &str) -> Option<String> {
    serde_json::from_str::<ErrorBody>(body)
        .ok()
        .and_then(|e| e.message)
}

fn quote(body: &str) -> String {
    let body = body.trim();
    let mut quoted: String = body.chars().take(QUOTED_BODY_CHARS).collect();
    if quoted.len() < body.len() {
        quoted.push('…');
    }
    quoted
}

/// `s` percent-encoded as one path segment (all but RFC 3986's unreserved characters).
fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for byte in s.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Standard base64 with padding (for the basic auth header).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    #[allow(
        clippy::indexing_slicing,
        reason = "masked to 0..64, the alphabet's length"
    )]
    let sextet = |v: u32| char::from(ALPHABET[(v & 63) as usize]);
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let mut block = [0_u8; 3];
        for (slot, byte) in block.iter_mut().zip(chunk) {
            *slot = *byte;
        }
        let v = u32::from(block[0]) << 16 | u32::from(block[1]) << 8 | u32::from(block[2]);
        out.push(sextet(v >> 18));
        out.push(sextet(v >> 12));
        out.push(if chunk.len() > 1 { sextet(v >> 6) } else { '=' });
        out.push(if chunk.len() > 2 { sextet(v) } else { '=' });
    }
    out
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // A panic elsewhere leaves a cache of complete entries: still usable.
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

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
}
