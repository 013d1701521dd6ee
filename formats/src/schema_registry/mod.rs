//! Schema registries that serve the Confluent REST contract (Confluent Schema Registry,
//! Apicurio's `ccompat` API, Karapace, Redpanda): writer schemas fetched by id and cached, the
//! latest version of a subject, schemas registered by sinks, and the wire format's framing.
//!
//! - [`client`]: the HTTP client ([`RegistryClient`]): basic auth, a CA file, timeouts,
//!   retries, a cache by id.
//! - [`wire`]: the Confluent framing (a zero byte, a 4-byte big-endian schema id, the payload).

pub mod client;
pub mod wire;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use client::RegistryClient;

/// `schema_registry: { url, subject | strategy, username, password, ca_file, timeout_ms }` of
/// a Kafka source or sink. `${VAR}`s are substituted in the pipeline file before this is read.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RegistryConfig {
    /// The registry's base URL (`http://host:8081`, `https://…/apis/ccompat/v7`).
    pub url: String,
    /// The subject of the value schema; unset: named by `strategy`.
    #[serde(default)]
    pub subject: Option<String>,
    #[serde(default)]
    pub strategy: SubjectStrategy,
    /// Basic auth (both or neither).
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password: Option<String>,
    /// PEM file of the CA that signed the registry's certificate (default: the system's roots).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Longest wait for one request, retries included.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Sinks: register the written schema under the subject (`true`), or only look it up and
    /// refuse to run when it is not registered there (`false`, for registries where schemas
    /// are registered by a deploy step, as `auto.register.schemas=false`).
    #[serde(default = "default_auto_register")]
    pub auto_register: bool,
}

fn default_auto_register() -> bool {
    true
}

fn default_timeout_ms() -> u64 {
    10_000
}

/// How a subject is named when `subject` is not set (Confluent's subject name strategies).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SubjectStrategy {
    /// `<topic>-value`.
    #[default]
    TopicName,
    /// The record's full name (`com.example.Click`).
    RecordName,
    /// `<topic>-<record full name>`.
    TopicRecordName,
}

/// The kind of a registered schema (`schemaType`; absent means Avro).
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "UPPERCASE")]
pub enum SchemaType {
    #[default]
    Avro,
    Protobuf,
    Json,
}

/// A schema another one imports (Protobuf imports, Avro named types from other subjects).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, Hash)]
pub struct SchemaReference {
    /// The name the referring schema uses (a `.proto` import path, an Avro full name).
    pub name: String,
    pub subject: String,
    pub version: i32,
}

/// A schema as the registry holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisteredSchema {
    pub id: u32,
    pub schema_type: SchemaType,
    /// The schema's text: Avro JSON, `.proto` source or JSON Schema.
    pub schema: String,
    pub references: Vec<SchemaReference>,
    /// Known when fetched by subject.
    pub subject: Option<String>,
    pub version: Option<i32>,
}

/// Errors of the registry and of the wire format; each names the registry URL or the payload.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// `schema_registry:` is wrong (`what` says what was expected).
    #[error("schema_registry: {0}")]
    Config(String),
    /// The registry could not be reached or answered with an error.
    #[error("schema registry {url}: {what}")]
    Request { url: String, what: String },
    /// The registry holds no such schema, subject or version (404).
    #[error("schema registry {url}: {what}")]
    NotFound { url: String, what: String },
    /// A payload is not in the Confluent wire format.
    #[error("{0}")]
    Wire(String),
}

/// Where writer schemas are found by id: the registry, or a fixed set (tests, replays).
pub trait SchemaLookup: Send + Sync + std::fmt::Debug {
    /// The schema registered with `id`.
    fn by_id(&self, id: u32) -> Result<Arc<RegisteredSchema>, RegistryError>;
    /// The schemas `schema` references, transitively, each with the name it is imported by
    /// (dependencies before the schemas that import them).
    fn references(
        &self,
        schema: &RegisteredSchema,
    ) -> Result<Vec<(String, Arc<RegisteredSchema>)>, RegistryError>;
}

/// A fixed set of schemas by id (no references).
#[derive(Debug, Default)]
pub struct StaticSchemas(pub HashMap<u32, Arc<RegisteredSchema>>);

impl SchemaLookup for StaticSchemas {
    fn by_id(&self, id: u32) -> Result<Arc<RegisteredSchema>, RegistryError> {
        self.0
            .get(&id)
            .cloned()
            .ok_or_else(|| RegistryError::NotFound {
                url: "(fixed schemas)".into(),
                what: format!("no schema with id {id}"),
            })
    }

    fn references(
        &self,
        _schema: &RegisteredSchema,
    ) -> Result<Vec<(String, Arc<RegisteredSchema>)>, RegistryError> {
        Ok(Vec::new())
    }
}
