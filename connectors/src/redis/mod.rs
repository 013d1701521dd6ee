//! Redis sink: each result row sets one key (`recs:{user_id}`) to the row as JSON or to one
//! column, so a service reads each entity's latest result with a `GET`.
//!
//! Runs with checkpoints are exactly-once in the sense that matters for keys: after any crash
//! and restart, every key ends with the value an uninterrupted run leaves. The writes of each
//! checkpoint commit together with a position key in one `MULTI`/`EXEC`;
//! runs without checkpoints write at each epoch's flush. Plain TCP (`redis://`), through the
//! `redis` crate's blocking client; the URL's password never appears in a message.

mod client;
mod config;
mod render;
mod sink;
mod template;
mod transaction;
mod writer;
mod writes;

pub use config::{redacted, RedisSinkConfig};
pub use sink::RedisSinkFactory;
pub use template::{KeyTemplate, ValueSpec};
pub use writer::RedisSink;
pub use writes::Write;
