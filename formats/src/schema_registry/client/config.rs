//! Checking `schema_registry:` beyond its syntax (the URL, basic auth) and naming the subject
//! of a topic's schema.

use ureq::http::Uri;

use crate::schema_registry::{RegistryConfig, RegistryError, SubjectStrategy};

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
pub(super) fn check_url(url: &str) -> Result<String, RegistryError> {
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

/// The `Authorization` header of basic auth, when `username` and `password` are set (both or
/// neither).
pub(super) fn basic_auth(config: &RegistryConfig) -> Result<Option<String>, RegistryError> {
    match (&config.username, &config.password) {
        (Some(user), Some(password)) => Ok(Some(format!(
            "Basic {}",
            base64(format!("{user}:{password}").as_bytes())
        ))),
        (None, None) => Ok(None),
        (Some(_), None) => Err(RegistryError::Config(
            "username is set without password: expected both (basic auth) or neither".into(),
        )),
        (None, Some(_)) => Err(RegistryError::Config(
            "password is set without username: expected both (basic auth) or neither".into(),
        )),
    }
}

/// Standard base64 with padding (for the basic auth header).
pub(super) fn base64(bytes: &[u8]) -> String {
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
