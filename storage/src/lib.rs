//! Object storage for checkpoints and file sinks: a local directory or an S3-compatible
//! bucket behind one blocking interface, [`Location`], built on the `object_store` crate.
//!
//! Riffle's writers run on timely worker threads, not in an async runtime, so each
//! [`Location`] owns a small current-thread Tokio runtime and blocks on it. Every error names
//! the URL and the operation, so an operator can tell a refused credential from a missing
//! bucket from a store that is down. On S3 every request is signed, bounded by
//! [`StoreOptions::timeout_s`] (retries included), and conditional writes map to
//! `If-None-Match: *` ([`Location::put_new`]) and `If-Match` ([`Location::put_if_match`], with
//! the [`Version`] read or written before): what checkpoints and their lease rely on.
//! `memory://name/prefix` is an in-process store with the same semantics, for tests.
//!
//! ```
//! let dir = tempfile::tempdir().unwrap();
//! let at = riffle_storage::Location::parse(dir.path().to_str().unwrap(), &Default::default()).unwrap();
//! assert!(at.put_new("a/b.txt", b"one".to_vec()).unwrap());
//! assert!(!at.put_new("a/b.txt", b"two".to_vec()).unwrap(), "never overwritten");
//! assert_eq!(at.get("a/b.txt").unwrap().as_deref(), Some(&b"one"[..]));
//! assert_eq!(at.list("a/").unwrap(), vec![("a/b.txt".to_string(), 3)]);
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::{Path as ObjectPath, PathPart};
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use serde::Deserialize;

/// What went wrong, with the URL and the operation.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("{url}: {why}")]
    Config { url: String, why: String },
    #[error("{operation} {url}: {source}")]
    Store {
        operation: &'static str,
        url: String,
        #[source]
        source: object_store::Error,
    },
    #[error("starting the storage client's runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

pub type StorageResult<T> = Result<T, StorageError>;

/// Connection settings beside a URL (pipeline keys; `${VAR}`s are expanded by the pipeline
/// loader). Unset ones come from the usual AWS variables (`AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`, `AWS_ENDPOINT_URL`,
/// `AWS_ALLOW_HTTP`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StoreOptions {
    /// An S3-compatible server's address (`http://127.0.0.1:9000`); plain `http` is allowed
    /// when named here.
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub region: Option<String>,
    #[serde(default)]
    pub access_key_id: Option<String>,
    #[serde(default)]
    pub secret_access_key: Option<String>,
    #[serde(default)]
    pub session_token: Option<String>,
    /// Give up on one request after this long (retries included); the caller decides what a
    /// failure means (a checkpoint is retried later, a sink's commit fails the run).
    #[serde(default)]
    pub timeout_s: Option<u64>,
}

/// Which write of an object a conditional update must find there (its ETag): see
/// [`Location::get_versioned`] and [`Location::put_if_match`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    e_tag: Option<String>,
    version: Option<String>,
}

impl Version {
    fn of(e_tag: Option<String>, version: Option<String>) -> Version {
        Version { e_tag, version }
    }

    fn update(&self) -> UpdateVersion {
        UpdateVersion {
            e_tag: self.e_tag.clone(),
            version: self.version.clone(),
        }
    }
}

/// A folder in a store: `s3://bucket/prefix`, `file:///dir`, a plain path, or (tests)
/// `memory://name/prefix`.
#[derive(Clone)]
pub struct Location {
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    url: String,
    runtime: Arc<tokio::runtime::Runtime>,
}

// A panic during a request leaves nothing half-changed that a later call could see: each
// operation is one request (or a read of one), and the clients keep no state between them.
impl std::panic::UnwindSafe for Location {}
impl std::panic::RefUnwindSafe for Location {}

impl fmt::Debug for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Location").field("url", &self.url).finish()
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.url)
    }
}

/// Whether `text` names an object store rather than a local path.
pub fn is_url(text: &str) -> bool {
    text.contains("://")
}

impl Location {
    /// Opens `url`; a local directory is created if missing.
    pub fn parse(url: &str, options: &StoreOptions) -> StorageResult<Location> {
        let config = |why: String| StorageError::Config {
            url: url.to_string(),
            why,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(StorageError::Runtime)?;
        let (store, prefix): (Arc<dyn ObjectStore>, ObjectPath) = if let Some(rest) =
            url.strip_prefix("s3://")
        {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(config("no bucket (expected s3://bucket/prefix)".into()));
            }
            (
                s3(bucket, options).map_err(config)?,
                ObjectPath::from(prefix),
            )
        } else if let Some(rest) = url.strip_prefix("memory://") {
            let (name, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            (in_memory(name), ObjectPath::from(prefix))
        } else if is_url(url) && !url.starts_with("file://") {
            return Err(config(
                "unsupported scheme (expected s3://bucket/prefix, file:///dir or a path)".into(),
            ));
        } else {
            let dir = url.strip_prefix("file://").unwrap_or(url);
            std::fs::create_dir_all(dir)
                .map_err(|e| config(format!("creating the directory: {e}")))?;
            let store = LocalFileSystem::new_with_prefix(dir).map_err(|e| config(e.to_string()))?;
            (Arc::new(store), ObjectPath::default())
        };
        Ok(Location {
            store,
            prefix,
            url: url.trim_end_matches('/').to_string(),
            runtime: Arc::new(runtime),
        })
    }

    /// The URL it was opened with.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether this is a local directory (renames are atomic there; `memory://` is not local:
    /// it stands in for an object store).
    pub fn is_local(&self) -> bool {
        !self.url.starts_with("s3://") && !self.url.starts_with("memory://")
    }

    /// The same store, one folder down.
    pub fn child(&self, name: &str) -> Location {
        let mut prefix = self.prefix.clone();
        for part in name.split('/').filter(|p| !p.is_empty()) {
            prefix = prefix.join(part);
        }
        Location {
            store: self.store.clone(),
            prefix,
            url: format!("{}/{}", self.url, name.trim_matches('/')),
            runtime: self.runtime.clone(),
        }
    }

    /// Names are keys as given: a `%` or `#` stays itself (a Hive folder `k=a%2Fb` is that
    /// key, not `k=a%252Fb`), so `list` returns exactly the names written. Only a segment the
    /// store cannot hold as is (`.`, `..`, control characters) is percent-encoded.
    fn path(&self, name: &str) -> ObjectPath {
        let mut path = self.prefix.clone();
        for part in name.split('/').filter(|p| !p.is_empty()) {
            path = match PathPart::parse(part) {
                Ok(raw) => path.join(raw),
                Err(_) => path.join(part),
            };
        }
        path
    }

    fn error(
        &self,
        operation: &'static str,
        name: &str,
        source: object_store::Error,
    ) -> StorageError {
        StorageError::Store {
            operation,
            url: format!("{}/{name}", self.url),
            source,
        }
    }

    /// Writes `name`, replacing what is there. The object appears whole or not at all.
    pub fn put(&self, name: &str, bytes: Vec<u8>) -> StorageResult<()> {
        let path = self.path(name);
        self.runtime
            .block_on(self.store.put(&path, PutPayload::from(bytes)))
            .map(|_| ())
            .map_err(|e| self.error("writing", name, e))
    }

    /// Writes `name` only if nothing is there (a conditional put): `false` when it exists.
    ///
    /// A request whose answer was lost (a timeout) may still have been applied: a caller that
    /// tries again and gets `false` should read the object to tell its own write from another.
    pub fn put_new(&self, name: &str, bytes: Vec<u8>) -> StorageResult<bool> {
        self.put_new_versioned(name, bytes).map(|v| v.is_some())
    }

    /// [`Self::put_new`], with the version written (`None` when something was there).
    pub fn put_new_versioned(&self, name: &str, bytes: Vec<u8>) -> StorageResult<Option<Version>> {
        let path = self.path(name);
        let options = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        match self
            .runtime
            .block_on(self.store.put_opts(&path, PutPayload::from(bytes), options))
        {
            Ok(done) => Ok(Some(Version::of(done.e_tag, done.version))),
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => Ok(None),
            Err(e) => Err(self.error("writing (if absent)", name, e)),
        }
    }

    /// Replaces `name` only if it is still the write `expected` (`If-Match`): the new
    /// version, or `None` when another write replaced it or it is gone. Needs a store with
    /// conditional updates (S3 since 2024, MinIO, S3Proxy); a local directory has none.
    pub fn put_if_match(
        &self,
        name: &str,
        bytes: Vec<u8>,
        expected: &Version,
    ) -> StorageResult<Option<Version>> {
        let path = self.path(name);
        let options = PutOptions {
            mode: PutMode::Update(expected.update()),
            ..PutOptions::default()
        };
        match self
            .runtime
            .block_on(self.store.put_opts(&path, PutPayload::from(bytes), options))
        {
            Ok(done) => Ok(Some(Version::of(done.e_tag, done.version))),
            Err(object_store::Error::Precondition { .. })
            | Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error("writing (if unchanged)", name, e)),
        }
    }

    /// Reads `name` with its version; `None` when absent.
    pub fn get_versioned(&self, name: &str) -> StorageResult<Option<(Bytes, Version)>> {
        let path = self.path(name);
        let result = self.runtime.block_on(async {
            match self.store.get(&path).await {
                Ok(found) => {
                    let version = Version::of(found.meta.e_tag.clone(), found.meta.version.clone());
                    found.bytes().await.map(|b| Some((b, version)))
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        });
        result.map_err(|e| self.error("reading", name, e))
    }

    /// Reads `name`; `None` when absent.
    pub fn get(&self, name: &str) -> StorageResult<Option<Bytes>> {
        let path = self.path(name);
        let result = self.runtime.block_on(async {
            match self.store.get(&path).await {
                Ok(found) => found.bytes().await.map(Some),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        });
        result.map_err(|e| self.error("reading", name, e))
    }

    /// Objects under `prefix` (relative names, `a/b`), with their sizes, sorted by name.
    pub fn list(&self, prefix: &str) -> StorageResult<Vec<(String, u64)>> {
        let base = self.prefix.clone();
        // `list` matches whole segments: list the folder, then filter by the name's start.
        let folder = prefix.rsplit_once('/').map_or("", |(folder, _)| folder);
        let under = self.path(folder);
        let listed: Result<Vec<_>, _> = self
            .runtime
            .block_on(self.store.list(Some(&under)).try_collect::<Vec<_>>());
        let listed = listed.map_err(|e| self.error("listing", prefix, e))?;
        let mut names: BTreeMap<String, u64> = BTreeMap::new();
        for meta in listed {
            let relative: Vec<String> = match meta.location.prefix_match(&base) {
                Some(parts) => parts.map(|p| p.as_ref().to_string()).collect(),
                None => continue,
            };
            let name = relative.join("/");
            if name.starts_with(prefix.trim_start_matches('/')) {
                names.insert(name, meta.size);
            }
        }
        Ok(names.into_iter().collect())
    }

    /// Removes `name`; absent is fine.
    pub fn delete(&self, name: &str) -> StorageResult<()> {
        let path = self.path(name);
        match self.runtime.block_on(self.store.delete(&path)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error("deleting", name, e)),
        }
    }

    /// Copies `from` to `to` (replacing), then removes `from`: atomic on a local disk, a
    /// server-side copy on S3. Idempotent when `from` is already gone and `to` is there.
    pub fn rename(&self, from: &str, to: &str) -> StorageResult<()> {
        let (a, b) = (self.path(from), self.path(to));
        match self.runtime.block_on(self.store.rename(&a, &b)) {
            Ok(()) => Ok(()),
            Err(object_store::Error::NotFound { .. }) if self.get_meta(to)? => Ok(()),
            Err(e) => Err(self.error("renaming", from, e)),
        }
    }

    fn get_meta(&self, name: &str) -> StorageResult<bool> {
        let path = self.path(name);
        match self.runtime.block_on(self.store.head(&path)) {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.error("inspecting", name, e)),
        }
    }

    /// Whether `name` exists.
    pub fn exists(&self, name: &str) -> StorageResult<bool> {
        self.get_meta(name)
    }
}

/// The in-memory store `memory://name` of this process (one per name, shared by every
/// [`Location`] opened on it): tests of code that writes to object stores, where conditional
/// puts behave as on S3.
fn in_memory(name: &str) -> Arc<dyn ObjectStore> {
    static STORES: std::sync::OnceLock<std::sync::Mutex<BTreeMap<String, Arc<InMemory>>>> =
        std::sync::OnceLock::new();
    let stores = STORES.get_or_init(Default::default);
    // A poisoned lock only means another test panicked while holding it: the map is intact.
    let mut stores = stores.lock().unwrap_or_else(|e| e.into_inner());
    stores.entry(name.to_string()).or_default().clone()
}

/// Without the `s3` feature (a build for local checkpoints only) an `s3://` URL says so.
#[cfg(not(feature = "s3"))]
fn s3(_bucket: &str, _options: &StoreOptions) -> Result<Arc<dyn ObjectStore>, String> {
    Err(
        "this riffle was built without the `s3` feature: rebuild with default features \
         (cargo build --release) for S3 stores"
            .into(),
    )
}

/// An S3 client for `bucket`: `options` first, then the usual AWS variables.
#[cfg(feature = "s3")]
fn s3(bucket: &str, options: &StoreOptions) -> Result<Arc<dyn ObjectStore>, String> {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey, S3ConditionalPut};
    use object_store::{BackoffConfig, ClientConfigKey, RetryConfig};
    use std::time::Duration;
    // reqwest is built without a TLS provider of its own (see the workspace's object_store);
    // an error only means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_conditional_put(S3ConditionalPut::ETagMatch);
    let endpoint = options
        .endpoint
        .clone()
        .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok());
    if let Some(endpoint) = endpoint {
        builder = builder
            .with_allow_http(endpoint.starts_with("http://"))
            .with_endpoint(endpoint);
    }
    if let Some(v) = &options.region {
        builder = builder.with_region(v);
    } else if std::env::var("AWS_REGION").is_err() && std::env::var("AWS_DEFAULT_REGION").is_err() {
        builder = builder.with_region("us-east-1");
    }
    if let Some(v) = &options.access_key_id {
        builder = builder.with_access_key_id(v);
    }
    if let Some(v) = &options.secret_access_key {
        builder = builder.with_secret_access_key(v);
    }
    if let Some(v) = &options.session_token {
        builder = builder.with_token(v);
    }
    let timeout = Duration::from_secs(options.timeout_s.unwrap_or(30).max(1));
    builder = builder.with_retry(RetryConfig {
        backoff: BackoffConfig::default(),
        max_retries: 4,
        retry_timeout: timeout,
    });
    // One request never outlasts the whole budget (a hung server, not a refused
    // connection, would otherwise hold each try for the client's default 30 s).
    // Some servers (S3Proxy) refuse a PUT without a content type.
    builder = builder
        .with_config(
            AmazonS3ConfigKey::Client(ClientConfigKey::Timeout),
            format!("{}s", timeout.as_secs()),
        )
        .with_config(
            AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout),
            format!("{}s", timeout.as_secs().min(5)),
        )
        .with_config(
            AmazonS3ConfigKey::Client(ClientConfigKey::DefaultContentType),
            "application/octet-stream",
        );
    let store = builder.build().map_err(|e| e.to_string())?;
    Ok(Arc::new(store))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_directory_puts_lists_renames_and_refuses_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let at = Location::parse(dir.path().to_str().unwrap(), &StoreOptions::default()).unwrap();
        assert!(at.is_local());
        assert!(at.put_new("x/epoch-1", b"1".to_vec()).unwrap());
        assert!(!at.put_new("x/epoch-1", b"2".to_vec()).unwrap());
        at.put("x/other", b"22".to_vec()).unwrap();
        assert_eq!(
            at.list("x/epoch-").unwrap(),
            vec![("x/epoch-1".to_string(), 1)]
        );
        at.rename("x/other", "y/moved").unwrap();
        at.rename("x/other", "y/moved").unwrap();
        assert_eq!(at.get("y/moved").unwrap().as_deref(), Some(&b"22"[..]));
        assert_eq!(at.get("x/other").unwrap(), None);
        let child = at.child("y");
        assert_eq!(child.list("").unwrap(), vec![("moved".to_string(), 2)]);
        child.delete("moved").unwrap();
        child.delete("moved").unwrap();
        assert!(!child.exists("moved").unwrap());
    }

    #[test]
    fn conditional_updates_need_the_version_still_there() {
        let at = Location::parse("memory://conditional/p", &StoreOptions::default()).unwrap();
        assert!(!at.is_local());
        let first = at
            .put_new_versioned("lease", b"a".to_vec())
            .unwrap()
            .unwrap();
        assert_eq!(at.put_new_versioned("lease", b"b".to_vec()).unwrap(), None);
        let (bytes, seen) = at.get_versioned("lease").unwrap().unwrap();
        assert_eq!((&bytes[..], &seen), (&b"a"[..], &first));
        let second = at
            .put_if_match("lease", b"c".to_vec(), &first)
            .unwrap()
            .unwrap();
        assert_ne!(second, first);
        // A stale version loses: two takers of one lease cannot both win.
        assert_eq!(
            at.put_if_match("lease", b"d".to_vec(), &first).unwrap(),
            None
        );
        assert_eq!(at.get("lease").unwrap().as_deref(), Some(&b"c"[..]));
        at.delete("lease").unwrap();
        assert_eq!(
            at.put_if_match("lease", b"e".to_vec(), &second).unwrap(),
            None
        );
        assert_eq!(at.get_versioned("lease").unwrap(), None);
        // The same name is the same store, and prefixes keep apart.
        let again = Location::parse("memory://conditional", &StoreOptions::default()).unwrap();
        again.put("p/x", b"1".to_vec()).unwrap();
        assert_eq!(at.get("x").unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(at.url(), "memory://conditional/p");
    }

    #[test]
    fn names_are_kept_as_written_percent_and_hash_included() {
        let dir = tempfile::tempdir().unwrap();
        let at = Location::parse(dir.path().to_str().unwrap(), &StoreOptions::default()).unwrap();
        at.put("k=a%2Fb#c/x", b"1".to_vec()).unwrap();
        assert!(
            dir.path().join("k=a%2Fb#c/x").is_file(),
            "the folder is named as given"
        );
        assert_eq!(at.list("").unwrap(), vec![("k=a%2Fb#c/x".to_string(), 1)]);
        at.rename("k=a%2Fb#c/x", "k=a%2Fb#c/y").unwrap();
        assert_eq!(
            at.list("k=a%2Fb#c/").unwrap(),
            vec![("k=a%2Fb#c/y".to_string(), 1)]
        );
        at.delete("k=a%2Fb#c/y").unwrap();
        assert!(at.list("").unwrap().is_empty());
    }

    #[test]
    fn a_bad_url_names_itself() {
        let e = Location::parse("gs://b/p", &StoreOptions::default()).unwrap_err();
        assert!(
            e.to_string().starts_with("gs://b/p: unsupported scheme"),
            "{e}"
        );
        let e = Location::parse("s3:///p", &StoreOptions::default()).unwrap_err();
        assert!(e.to_string().contains("no bucket"), "{e}");
    }
}
