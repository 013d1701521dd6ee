//! `exchange:` blocks: their settings checked against each other, the placement groups and the
//! columns where they stand, the [`Route`] they become, and how `riffle plan` says it. The
//! settings are read in one place ([`ExchangeConfig::route`]); checks and descriptions follow
//! from the route.

use arrow_schema::SchemaRef;
use riffle_dataflow::runtime::Route;
use riffle_dataflow::Compression;
use serde::Deserialize;

use std::collections::BTreeMap;

/// `exchange:` — route each row to the worker owning its key, or, without a key, deal whole
/// batches round-robin to all workers (rebalancing a skewed source) or to the listed `workers`
/// (placing the stages that follow on them).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExchangeConfig {
    /// A string or integer column.
    #[serde(default)]
    pub key: Option<String>,
    /// Only these workers run the stages after this exchange (up to the next one): global
    /// worker indices, or a name from `runtime.placement`.
    #[serde(default)]
    pub workers: Option<Workers>,
    /// How batches travel between processes: `none`, `fp16` (f32 tensors as f16) or `sparse`
    /// (mostly-zero tensors as index/value pairs). Batches between threads are never encoded.
    #[serde(default)]
    pub compression: Compression,
    /// Route batches to the workers with the least measured delay (fed back through the
    /// dataflow from the end of the stages that follow) instead of round-robin.
    #[serde(default)]
    pub balance: bool,
    /// With `balance`: keep each key's rows of an epoch on one worker, so they stay in order.
    #[serde(default)]
    pub ordered_by: Option<String>,
    /// Cut every batch into one slice per worker and send one to each, so every worker gets
    /// its share of every batch however skewed the keys before were.
    #[serde(default)]
    pub spread: bool,
    /// With `spread`: runs of equal adjacent values in this column (a click's candidates) are
    /// never cut.
    #[serde(default)]
    pub together: Option<String>,
}

/// Workers by index, or by the name of a `runtime.placement` group.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Workers {
    List(Vec<usize>),
    Named(String),
}

/// `runtime.placement`: named groups of workers.
pub type Placement = BTreeMap<String, Vec<usize>>;

/// An exchange's settings that do not fit: the offending key and what was expected.
pub type ExchangeError = (&'static str, String);

impl ExchangeConfig {
    /// Where this exchange sends rows; settings that cannot go together, or a placement
    /// name `runtime.placement` lacks, are an error at their key.
    pub fn route(&self, placement: &Placement) -> Result<Route, ExchangeError> {
        if self.key.is_some() && self.workers.is_some() {
            return Err((
                "workers",
                "give `key` (re-shard rows) or `workers` (place the next stages), not both".into(),
            ));
        }
        if self.key.is_some() && self.balance {
            return Err((
                "balance",
                "`key` routes every row by hash; `balance` cannot apply (use `ordered_by` to \
                 keep a key's rows in order)"
                    .into(),
            ));
        }
        if self.spread && (self.key.is_some() || self.balance || self.workers.is_some()) {
            return Err((
                "spread",
                "`spread` shares every batch among all workers; it cannot be combined with \
                 `key`, `balance` or `workers`"
                    .into(),
            ));
        }
        if self.together.is_some() && !self.spread {
            return Err((
                "together",
                "`together` keeps runs whole when a batch is cut: it needs `spread: true`".into(),
            ));
        }
        let placed = self.placed_on(placement).map_err(|m| ("workers", m))?;
        Ok(match (&self.key, placed) {
            (Some(key), _) => Route::Key(key.clone()),
            (None, None) if self.spread => Route::Spread(self.together.clone()),
            (None, placed) if self.balance => {
                Route::Balance(placed.unwrap_or_default(), self.ordered_by.clone())
            }
            (None, Some(list)) => Route::Workers(list),
            (None, None) => Route::All,
        })
    }

    /// The route, checked against the columns of the batches reaching it.
    pub fn check(&self, placement: &Placement, schema: &SchemaRef) -> Result<(), ExchangeError> {
        for (key, column) in [
            ("together", &self.together),
            ("ordered_by", &self.ordered_by),
        ] {
            if let Some(k) = column
                .as_ref()
                .filter(|k| schema.field_with_name(k).is_err())
            {
                return Err((
                    key,
                    format!("no column `{k}` here; columns are: {}", column_list(schema)),
                ));
            }
        }
        if let Route::Key(key) = self.route(placement)? {
            match schema.field_with_name(&key).map(|f| f.data_type().clone()) {
                Ok(t) if riffle_dataflow::operators::is_key_type(&t) => {}
                Ok(t) => {
                    return Err((
                        "key",
                        format!("column `{key}` is {t}; expected a string or integer column"),
                    ))
                }
                Err(_) => {
                    return Err((
                        "key",
                        format!(
                            "no column `{key}` here; columns are: {}",
                            column_list(schema)
                        ),
                    ))
                }
            }
        }
        Ok(())
    }

    /// Whether the stages after it run on some workers only.
    pub fn places(&self) -> bool {
        self.key.is_none() && self.workers.is_some()
    }

    /// What it does, for `riffle plan`.
    pub fn describe(&self, placement: &Placement) -> String {
        let route = match self.route(placement) {
            Ok(Route::Key(key)) => format!("re-shard by `{key}`"),
            Ok(Route::Spread(together)) => format!(
                "every batch cut into one slice per worker{}",
                together.map_or(String::new(), |k| format!(", runs of `{k}` kept whole"))
            ),
            Ok(Route::Balance(workers, ordered_by)) => format!(
                "balance by measured delay over worker(s) {}{}",
                if workers.is_empty() {
                    "all".into()
                } else {
                    format!("{workers:?}")
                },
                ordered_by.map_or(String::new(), |k| format!(", `{k}` kept in order"))
            ),
            Ok(Route::Workers(list)) => format!("place the next stages on worker(s) {list:?}"),
            Ok(Route::All) => "rebalance round-robin".into(),
            Err((key, message)) => format!("invalid at `{key}`: {message}"),
        };
        match self.compression {
            Compression::None => route,
            c => format!("{route}, {c:?} between processes"),
        }
    }

    /// The workers this exchange places the following stages on, if it does; a name must be
    /// a `runtime.placement` group.
    pub fn placed_on(&self, placement: &Placement) -> Result<Option<Vec<usize>>, String> {
        Ok(match &self.workers {
            None => None,
            Some(Workers::List(list)) => Some(list.clone()),
            Some(Workers::Named(name)) => Some(placement.get(name).cloned().ok_or_else(|| {
                format!(
                    "no placement `{name}` in runtime.placement (it has: {})",
                    placement.keys().cloned().collect::<Vec<_>>().join(", ")
                )
            })?),
        })
    }
}

/// The columns of `schema`, with their types, for messages.
pub(crate) fn column_list(schema: &SchemaRef) -> String {
    schema
        .fields()
        .iter()
        .map(|f| format!("{} ({})", f.name(), f.data_type()))
        .collect::<Vec<_>>()
        .join(", ")
}
