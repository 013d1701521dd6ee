//! HTTP sink (webhooks): result rows POSTed (or PUT) as JSON to a URL, in requests of at most
//! `max_rows_per_request` rows, each with an `Idempotency-Key` that is the same when a request
//! is retried or an epoch replayed, so a receiver can drop repeats.
//!
//! Delivery is at-least-once. Connection errors, timeouts, 408, 429 and 5xx are retried with
//! backoff and, once `max_attempts` are spent, fail the run (results are never dropped
//! silently); any other 4xx is a refusal: the request's rows go to `dead_letter_path` and the
//! run goes on. Header values and the URL's credentials never appear in a message.

mod client;
mod config;
mod sink;

pub use config::{BodyFormat, HttpMethod, HttpSinkConfig};
pub use sink::{HttpSink, HttpSinkFactory};
