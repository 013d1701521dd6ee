//! Changing a running source's inputs (cameras added and removed while the pipeline runs).
//!
//! A source that can change its inputs hands out an [`InputControl`]
//! ([`SourceFactory::control`](crate::SourceFactory::control)); the HTTP endpoints of process 0
//! expose it (`/api/cameras`), and the other processes of a cluster apply process 0's
//! [`InputControl::snapshot`] so every process places the inputs alike.

use serde_json::Value;

/// Why a change was refused; nothing changed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ControlError {
    /// The request is malformed or names something invalid (HTTP 400).
    #[error("{0}")]
    BadRequest(String),
    /// No input with that id (HTTP 404).
    #[error("{0}")]
    NotFound(String),
    /// The id is taken, or the change conflicts with the running set (HTTP 409).
    #[error("{0}")]
    Conflict(String),
}

/// The inputs of a running source, listed and changed by id.
pub trait InputControl: Send + Sync {
    /// What the inputs are called in URLs and messages (`cameras`).
    fn noun(&self) -> &'static str;

    /// Every input: its id, settings and placement (JSON array).
    fn list(&self) -> Value;

    /// Adds the input `spec` describes (a JSON object); returns it as listed.
    fn add(&self, spec: Value) -> Result<Value, ControlError>;

    /// Removes the input `id`; returns it as it was listed.
    fn remove(&self, id: &str) -> Result<Value, ControlError>;

    /// The run serves this control (its live view is up): the source waits for inputs added
    /// later instead of ending with its inputs, unless its configuration says otherwise.
    fn keep_open(&self);

    /// The file the source watches for changes to its inputs (`cameras_file`), if any.
    fn watched_file(&self) -> Option<std::path::PathBuf> {
        None
    }

    /// The bearer token that guards changes on a non-loopback address, when configured.
    fn token(&self) -> Option<String>;

    /// The whole set with its placement, as process 0 holds it (sent to the other processes).
    fn snapshot(&self) -> Value;

    /// Makes this process's set what process 0's `snapshot` says.
    fn apply(&self, snapshot: &Value) -> Result<(), ControlError>;
}
