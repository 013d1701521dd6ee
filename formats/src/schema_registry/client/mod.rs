//! The blocking HTTP client of a registry that serves the Confluent REST contract.
//!
//! Blocking (ureq) because it is called from source and sink set-up and from worker threads,
//! sometimes inside a tokio runtime, where a blocking client that starts its own runtime would
//! panic. Schemas by id and by (subject, version) are immutable, so they are cached forever;
//! registrations are cached by (subject, type, text) so encoders can register freely.
//!
//! - `http.rs`: one request, with its retries, timeouts and headers.
//! - `replies.rs`: the registry's JSON bodies, and its error answers made into errors.
//! - `references.rs`: the schemas a schema references, resolved transitively.
//! - `config.rs`: checking `schema_registry:` (the URL, basic auth) and naming subjects.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use super::{RegisteredSchema, RegistryConfig, RegistryError, SchemaReference, SchemaType};

mod config;
mod http;
mod references;
mod replies;
#[cfg(test)]
mod tests;

pub use config::subject_for;

use config::{basic_auth, check_url};
use http::{agent, path_segment};
use replies::{not_found, parse, registered, request_body, status_error, IdBody, SchemaBody};

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
        let authorization = basic_auth(config)?;
        let agent = agent(config)?;
        Ok(Self {
            inner: Arc::new(Inner {
                base,
                agent,
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
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // A panic elsewhere leaves a cache of complete entries: still usable.
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}
