//! The registry's JSON: request and answer bodies, and its error answers made into errors that
//! name the URL and quote what the registry said.

use serde::{Deserialize, Serialize};

use super::{Method, Reply};
use crate::schema_registry::{RegisteredSchema, RegistryError, SchemaReference, SchemaType};

/// Longest part of a non-JSON error body quoted in an error.
const QUOTED_BODY_CHARS: usize = 200;

/// A schema as the registry answers it (`/schemas/ids/{id}` has no subject, version or id).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SchemaBody {
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
pub(super) struct IdBody {
    pub(super) id: u32,
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

pub(super) fn request_body(
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

pub(super) fn parse<T: serde::de::DeserializeOwned>(
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

pub(super) fn registered(
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

pub(super) fn not_found(reply: &Reply, url: String, what: String) -> RegistryError {
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

pub(super) fn status_error(
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
pub(super) fn registry_says(reply: &Reply) -> String {
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
