//! `sink: { postgres: {...} }`: the keys, what follows from the pipeline (`prepare`) and the
//! checks that need no server (`check_input`).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_schema::{Schema, SchemaRef};
use serde::Deserialize;
use serde_inline_default::serde_inline_default;

use riffle_dataflow::range::Range;
use riffle_dataflow::sink::SinkFactory;
use riffle_dataflow::{DataflowError, DataflowResult};

use super::connector::{self, Settled};
use super::sql::TableName;
use super::tls::TlsConfig;
use super::types::SqlType;
use crate::kind::{Limits, SinkContext, SinkKind, SinkRole};

/// Default name of the table that records each sink's last committed checkpoint.
pub const DEFAULT_POSITIONS_TABLE: &str = "riffle_sink_positions";

/// `sink: { postgres: {...} }`.
#[serde_inline_default]
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresSinkConfig {
    /// `postgres://user:password@host:port/database` (or libpq's `key=value` form); usually
    /// `${RIFFLE_PG_URL}`. The password never appears in messages.
    pub url: String,
    /// `table` or `schema.table`, taken as written (case-sensitive, quoted in SQL).
    pub table: String,
    /// Key columns: the primary key of a table the sink creates, and the conflict target of
    /// `upsert` (and of `insert`, whose rows with a key already present are skipped).
    #[serde(default)]
    pub key: KeyColumns,
    #[serde(default)]
    pub mode: WriteMode,
    /// Create the table when it does not exist (columns from the results, primary key from
    /// `key`); `false`: a missing table is an error.
    #[serde_inline_default(true)]
    pub create_table: bool,
    /// `{ mode, ca_file, client_cert, client_key }`; with the URL's `sslmode`, the
    /// connection's TLS (none when neither asks for it).
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Most rows per message of the binary COPY stream (a message also ends at 256 KiB).
    #[serde_inline_default(10_000)]
    pub batch_rows: usize,
    /// How long connecting (and authenticating) may take.
    #[serde_inline_default(10_000)]
    pub connect_timeout_ms: u64,
    /// Where each sink's last committed checkpoint is kept (in the table's schema when the
    /// table is `schema.table`).
    #[serde_inline_default(DEFAULT_POSITIONS_TABLE.to_string())]
    pub positions_table: String,
    /// The sink's row in the positions table: `<pipeline>/<table>`, set by `prepare`.
    #[serde(skip)]
    pub(super) sink_id: Option<String>,
    /// The results' schema, kept by `check_input` so that `build` can check (or create) the
    /// table before the run: the only hook that sees the schema takes `&self`.
    #[serde(skip)]
    pub(super) input: InputSchema,
    /// The pipeline's results (not dead letters or live results): the table is created when
    /// the sink opens, not at its first row.
    #[serde(skip)]
    pub(super) results: bool,
}

/// One key column (`key: id`) or several (`key: [user, item]`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(from = "OneOrMany")]
pub struct KeyColumns(pub Vec<String>);

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl From<OneOrMany> for KeyColumns {
    fn from(v: OneOrMany) -> Self {
        match v {
            OneOrMany::One(c) => KeyColumns(vec![c]),
            OneOrMany::Many(c) => KeyColumns(c),
        }
    }
}

/// How rows are written.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WriteMode {
    /// `INSERT`; with a `key`, a row whose key is already in the table is skipped
    /// (`ON CONFLICT DO NOTHING`: the first write of a key wins).
    #[default]
    Insert,
    /// `INSERT … ON CONFLICT (key) DO UPDATE`: the table keeps the latest row of each key.
    Upsert,
}

/// The results' schema, shared by the clones of one configuration.
#[derive(Clone, Default)]
pub(super) struct InputSchema(Arc<Mutex<Option<SchemaRef>>>);

impl InputSchema {
    pub fn get(&self) -> Option<SchemaRef> {
        self.0.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn set(&self, schema: SchemaRef) {
        if let Ok(mut s) = self.0.lock() {
            *s = Some(schema);
        }
    }
}

impl std::fmt::Debug for PostgresSinkConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresSinkConfig")
            .field("url", &redact_url(&self.url))
            .field("table", &self.table)
            .field("key", &self.key.0)
            .field("mode", &self.mode)
            .field("create_table", &self.create_table)
            .field("tls", &self.tls)
            .field("batch_rows", &self.batch_rows)
            .field("positions_table", &self.positions_table)
            .finish_non_exhaustive()
    }
}

impl PostgresSinkConfig {
    /// An error in this sink's configuration or set-up, naming its table and server (never
    /// the password).
    pub(crate) fn config_error(&self, message: impl std::fmt::Display) -> DataflowError {
        DataflowError::Config(format!("{}: {message}", self.describe()))
    }

    /// An error while writing.
    pub(crate) fn sink_error(&self, message: impl std::fmt::Display) -> DataflowError {
        DataflowError::stage("sink", format!("{}: {message}", self.describe()))
    }

    fn describe(&self) -> String {
        format!(
            "postgres sink (table `{}` at {})",
            self.table,
            redact_url(&self.url)
        )
    }

    /// The table's name, split and checked.
    pub(super) fn table_name(&self) -> DataflowResult<TableName> {
        TableName::parse(&self.table)
            .map_err(|e| self.config_error(format!("`table`: {e}")).at("table"))
    }

    /// The positions table, in the results table's schema.
    pub(super) fn positions_name(&self) -> DataflowResult<TableName> {
        let own = TableName::parse(&self.positions_table).map_err(|e| {
            self.config_error(format!("`positions_table`: {e}"))
                .at("positions_table")
        })?;
        Ok(match (own.schema.is_none(), self.table_name()?.schema) {
            (true, Some(schema)) => TableName {
                schema: Some(schema),
                ..own
            },
            _ => own,
        })
    }

    /// The row of this sink in the positions table.
    pub(super) fn sink_id(&self) -> String {
        self.sink_id
            .clone()
            .unwrap_or_else(|| format!("riffle/{}", self.table))
    }

    pub(super) fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    /// How to connect: the URL without its TLS parameters, the mode, the TLS connector (its
    /// files read).
    pub(super) fn settle_tls(&self) -> DataflowResult<Settled> {
        connector::settle(&self.url, self.tls.as_ref())
            .map_err(|e| self.config_error(e.message).at(e.key))
    }

    /// Checks what needs no server: names, key, ranges, TLS settings and files.
    pub(super) fn check(&self) -> DataflowResult<()> {
        self.table_name()?;
        self.positions_name()?;
        let [batch_rows, connect_timeout] = Self::RANGES else {
            return Ok(());
        };
        batch_rows.check_int(self.batch_rows as u64)?;
        connect_timeout.check_int(self.connect_timeout_ms)?;
        if self.mode == WriteMode::Upsert && self.key.0.is_empty() {
            return Err(self
                .config_error("`mode: upsert` needs `key`: the columns that identify a row")
                .at("key"));
        }
        self.settle_tls().map(|_| ())
    }
}

/// `url` with any password replaced by `***`: the userinfo of a URL
/// (`postgres://user:secret@host`), a `password=` query parameter, or a `password=` key of the
/// `key=value` form.
pub fn redact_url(url: &str) -> String {
    let mut out = url.to_string();
    for scheme in ["postgres://", "postgresql://"] {
        let Some(rest) = url.strip_prefix(scheme) else {
            continue;
        };
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let authority = rest.get(..authority_end).unwrap_or(rest);
        if let Some(at) = authority.rfind('@') {
            let userinfo = authority.get(..at).unwrap_or_default();
            if let Some(colon) = userinfo.find(':') {
                let user = userinfo.get(..colon).unwrap_or_default();
                let tail = rest.get(at..).unwrap_or_default();
                out = format!("{scheme}{user}:***{tail}");
            }
        }
    }
    redact_password_pairs(&out)
}

/// `password=value` (in a query string or the `key=value` form, the value possibly quoted)
/// with the value replaced.
fn redact_password_pairs(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut search = 0;
    while let Some(found) = lower.get(search..).and_then(|s| s.find("password")) {
        let start = search + found;
        let mut i = start + "password".len();
        let bytes = text.as_bytes();
        while bytes.get(i).is_some_and(|b| *b == b' ') {
            i += 1;
        }
        if bytes.get(i) != Some(&b'=') {
            search = i.max(start + 1);
            continue;
        }
        i += 1;
        while bytes.get(i).is_some_and(|b| *b == b' ') {
            i += 1;
        }
        let end = if bytes.get(i) == Some(&b'\'') {
            // A quoted value ends at the next unescaped quote.
            let mut j = i + 1;
            while j < bytes.len() && bytes.get(j) != Some(&b'\'') {
                j += if bytes.get(j) == Some(&b'\\') { 2 } else { 1 };
            }
            (j + 1).min(bytes.len())
        } else {
            let mut j = i;
            while bytes.get(j).is_some_and(|b| !matches!(b, b' ' | b'&')) {
                j += 1;
            }
            j
        };
        out.push_str(text.get(copied..i).unwrap_or_default());
        out.push_str("***");
        copied = end;
        search = end;
    }
    out.push_str(text.get(copied..).unwrap_or_default());
    out
}

impl SinkKind for PostgresSinkConfig {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        match &mut self.tls {
            Some(tls) => tls.paths_mut().collect(),
            None => Vec::new(),
        }
    }

    /// A table is no file: `--output` leaves the TLS files alone.
    fn output_mut(&mut self) -> Option<&mut PathBuf> {
        None
    }

    fn prepare(&mut self, ctx: &SinkContext<'_>) {
        // Results commit their checkpoint in the positions table under this id; dead letters
        // and live results never commit.
        if ctx.role == SinkRole::Results {
            self.sink_id = Some(format!("{}/{}", ctx.pipeline, self.table));
            self.results = true;
        }
    }

    fn check_input(&self, schema: &Schema) -> Result<(), String> {
        for field in schema.fields() {
            SqlType::of(field.data_type())
                .map_err(|e| format!("column `{}`: {e}", field.name()))?;
        }
        for key in &self.key.0 {
            if schema.field_with_name(key).is_err() {
                let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                return Err(format!(
                    "`key` names column `{key}`, which the results do not have (they have: {})",
                    names.join(", ")
                ));
            }
        }
        self.input.set(Arc::new(schema.clone()));
        Ok(())
    }

    /// The table `<table>_dead_letters` (stage, reason, record), created when missing.
    fn dead_letters(&self) -> Option<Self> {
        let mut dl = self.clone();
        dl.table = format!("{}_dead_letters", self.table);
        dl.key = KeyColumns::default();
        dl.mode = WriteMode::Insert;
        dl.create_table = true;
        dl.sink_id = None;
        dl.results = false;
        dl.input = InputSchema::default();
        dl.input.set(riffle_dataflow::dead_letter::schema());
        Some(dl)
    }

    fn build(&self) -> DataflowResult<Box<dyn SinkFactory>> {
        Ok(Box::new(super::PostgresSinkFactory::new(self)?))
    }
}

impl Limits for PostgresSinkConfig {
    const RANGES: &'static [Range] = &[
        Range::int("batch_rows", 1, 1_000_000),
        Range::int("connect_timeout_ms", 100, 600_000),
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted_in_every_form() {
        assert_eq!(
            redact_url("postgres://riffle:s3cret@127.0.0.1:5432/db"),
            "postgres://riffle:***@127.0.0.1:5432/db"
        );
        assert_eq!(
            redact_url("postgresql://u:p%40ss@h/db?sslmode=disable"),
            "postgresql://u:***@h/db?sslmode=disable"
        );
        assert_eq!(
            redact_url("postgres://u@h/db?password=hunter2&application_name=x"),
            "postgres://u@h/db?password=***&application_name=x"
        );
        assert_eq!(
            redact_url("host=h user=u password='a b\\'c' dbname=d"),
            "host=h user=u password=*** dbname=d"
        );
        assert_eq!(
            redact_url("host=h PASSWORD = x dbname=d"),
            "host=h PASSWORD = *** dbname=d"
        );
        assert_eq!(
            redact_url("postgres://u@h/db"),
            "postgres://u@h/db",
            "nothing to hide"
        );
    }

    #[test]
    fn key_is_one_column_or_a_list() {
        let one: PostgresSinkConfig =
            serde_json::from_value(serde_json::json!({"url": "u", "table": "t", "key": "id"}))
                .unwrap();
        assert_eq!(one.key.0, ["id"]);
        let many: PostgresSinkConfig = serde_json::from_value(
            serde_json::json!({"url": "u", "table": "t", "key": ["a", "b"], "mode": "upsert"}),
        )
        .unwrap();
        assert_eq!(many.key.0, ["a", "b"]);
        assert_eq!(many.mode, WriteMode::Upsert);
        assert!(many.create_table, "tables are created by default");
        assert!(format!("{many:?}").contains("url: \"u\""));
    }

    #[test]
    fn debug_output_hides_the_password() {
        let c: PostgresSinkConfig = serde_json::from_value(
            serde_json::json!({"url": "postgres://a:topsecret@h/d", "table": "t"}),
        )
        .unwrap();
        let shown = format!("{c:?}");
        assert!(!shown.contains("topsecret"), "{shown}");
        assert!(!c.config_error("x").to_string().contains("topsecret"));
    }

    #[test]
    fn config_errors_name_the_key() {
        let base = serde_json::json!({"url": "u", "table": "t"});
        let with = |k: &str, v: serde_json::Value| {
            let mut c = base.clone();
            c[k] = v;
            serde_json::from_value::<PostgresSinkConfig>(c).unwrap()
        };
        let e = with("mode", "upsert".into()).check().unwrap_err();
        assert!(
            matches!(&e, DataflowError::At { key, .. } if key == "key"),
            "{e}"
        );
        let e = with("batch_rows", 0.into()).check().unwrap_err();
        assert!(
            matches!(&e, DataflowError::At { key, .. } if key == "batch_rows"),
            "{e}"
        );
        let e = with("tls", serde_json::json!({"ca_file": "/nonexistent/ca.pem"}))
            .check()
            .unwrap_err();
        assert!(
            matches!(&e, DataflowError::At { key, .. } if key == "tls.ca_file"),
            "{e}"
        );
        assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
        let e = with("url", "postgres://h/d?sslmode=on".into())
            .check()
            .unwrap_err();
        assert!(
            matches!(&e, DataflowError::At { key, .. } if key == "url"),
            "{e}"
        );
        let e = with("table", "a.b.c".into()).check().unwrap_err();
        assert!(
            matches!(&e, DataflowError::At { key, .. } if key == "table"),
            "{e}"
        );
    }

    #[test]
    fn tls_paths_are_resolved_but_never_taken_for_the_output() {
        let mut c: PostgresSinkConfig = serde_json::from_value(serde_json::json!({
            "url": "u", "table": "t",
            "tls": {"ca_file": "ca.pem", "client_cert": "c.pem", "client_key": "k.pem"}
        }))
        .unwrap();
        // `riffle run --output` has no file to replace.
        assert!(c.output_mut().is_none());
        let paths = c.paths_mut();
        assert_eq!(paths.len(), 3);
        for p in paths {
            *p = PathBuf::from("/pipelines").join(&*p);
        }
        let tls = c.tls.unwrap();
        assert_eq!(tls.ca_file.unwrap(), PathBuf::from("/pipelines/ca.pem"));
        assert_eq!(tls.client_key.unwrap(), PathBuf::from("/pipelines/k.pem"));
    }

    #[test]
    fn check_input_refuses_unknown_keys_and_unmapped_types() {
        use arrow_schema::{DataType, Field};
        let c: PostgresSinkConfig =
            serde_json::from_value(serde_json::json!({"url": "u", "table": "t", "key": "nope"}))
                .unwrap();
        let schema = Schema::new(vec![Field::new("id", DataType::Int64, false)]);
        let e = c.check_input(&schema).unwrap_err();
        assert!(e.contains("`nope`") && e.contains("id"), "{e}");
        let c: PostgresSinkConfig =
            serde_json::from_value(serde_json::json!({"url": "u", "table": "t"})).unwrap();
        let schema = Schema::new(vec![Field::new(
            "d",
            DataType::Duration(arrow_schema::TimeUnit::Second),
            true,
        )]);
        let e = c.check_input(&schema).unwrap_err();
        assert!(e.contains("column `d`"), "{e}");
        assert!(c.input.get().is_none(), "a refused schema is not kept");
    }

    #[test]
    fn positions_go_to_the_tables_schema_and_dead_letters_to_their_own_table() {
        let mut c: PostgresSinkConfig = serde_json::from_value(
            serde_json::json!({"url": "u", "table": "analytics.events", "key": "id"}),
        )
        .unwrap();
        let p = c.positions_name().unwrap();
        assert_eq!(p.schema.as_deref(), Some("analytics"));
        assert_eq!(p.name, DEFAULT_POSITIONS_TABLE);
        c.prepare(&SinkContext {
            pipeline: "clicks",
            role: SinkRole::Results,
        });
        assert_eq!(c.sink_id(), "clicks/analytics.events");
        let dl = c.dead_letters().unwrap();
        assert_eq!(dl.table, "analytics.events_dead_letters");
        assert!(dl.key.0.is_empty());
        assert!(dl
            .input
            .get()
            .is_some_and(|s| s.field_with_name("reason").is_ok()));
        assert!(
            c.input.get().is_none(),
            "the results' schema is not the dead letters'"
        );
    }
}
