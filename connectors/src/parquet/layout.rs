//! Where files go: staged names (`_staging/<generation>/<partition>/<first>-<last>-<seq>.parquet.staged`),
//! published names (`<partition>/part-<generation>-<last>-<seq>.parquet`) and hive-style
//! partition folders (`country=DE/day=2024-01-31`).
//!
//! Staged files end in `.staged`, not `.parquet`, and live under `_staging/`: a reader of
//! `**/*.parquet` (DuckDB) or of the dataset (pyarrow and Spark skip `_` folders) never sees
//! one.

use riffle_dataflow::Epoch;

/// The folder holding every run's files that no checkpoint has committed yet.
pub const STAGING: &str = "_staging";

const STAGED_SUFFIX: &str = ".parquet.staged";

/// The end of a local file's name while it is written (under `_staging/`, until it closes).
pub const OPEN_SUFFIX: &str = ".parquet.open";

/// Hive's name of the folder of a null (or empty) partition value.
pub const NULL_PARTITION: &str = "__HIVE_DEFAULT_PARTITION__";

/// A staged file of a run with checkpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Staged {
    pub generation: u64,
    /// Partition folders (`k=v/k2=v2`), empty when not partitioned.
    pub partition: String,
    pub first_epoch: Epoch,
    pub last_epoch: Epoch,
    pub seq: u64,
}

impl Staged {
    /// Its name under the sink's root.
    pub fn name(&self) -> String {
        format!(
            "{STAGING}/{}/{}{}-{}-{}{STAGED_SUFFIX}",
            self.generation,
            folder(&self.partition),
            self.first_epoch,
            self.last_epoch,
            self.seq
        )
    }

    /// The name it is published under once its last epoch is committed.
    pub fn published(&self) -> String {
        format!(
            "{}part-{}-{}-{}.parquet",
            folder(&self.partition),
            self.generation,
            self.last_epoch,
            self.seq
        )
    }

    /// Reads a staged name back (`None`: not one of ours).
    pub fn parse(name: &str) -> Option<Staged> {
        let rest = name.strip_prefix(STAGING)?.strip_prefix('/')?;
        let (generation, rest) = rest.split_once('/')?;
        let (partition, file) = rest.rsplit_once('/').unwrap_or(("", rest));
        let mut numbers = file.strip_suffix(STAGED_SUFFIX)?.split('-');
        let mut next = || numbers.next().and_then(|n| n.parse::<u64>().ok());
        let staged = Staged {
            generation: generation.parse().ok()?,
            partition: partition.to_string(),
            first_epoch: next()?,
            last_epoch: next()?,
            seq: next()?,
        };
        numbers.next().is_none().then_some(staged)
    }
}

/// The generation folder a staged name is in, as written.
pub fn staged_generation(name: &str) -> Option<&str> {
    name.strip_prefix(STAGING)?
        .strip_prefix('/')?
        .split('/')
        .next()
}

/// The name the `n`th file a sink opens in a local folder has while it is written:
/// `_staging/<generation>/open-<n>.parquet.open`, or `_staging/run-<run>-<n>.parquet.open` in a
/// run without checkpoints. Fencing removes those a crashed run left, with its staged files.
pub fn open_name(generation: Option<u64>, run: u64, n: u64) -> String {
    match generation {
        Some(generation) => format!("{STAGING}/{generation}/open-{n}{OPEN_SUFFIX}"),
        None => format!("{STAGING}/run-{run}-{n}{OPEN_SUFFIX}"),
    }
}

/// The name of a file of a run without checkpoints, published as it closes.
pub fn unstaged(partition: &str, run: u64, seq: u64) -> String {
    format!("{}part-{run}-{seq}.parquet", folder(partition))
}

fn folder(partition: &str) -> String {
    if partition.is_empty() {
        String::new()
    } else {
        format!("{partition}/")
    }
}

/// One `key=value` folder, a null or empty value being Hive's default partition. Characters
/// Hive escapes in folder names (`/`, `=`, `#`, `%`, …) are percent-encoded as Hive does, so
/// DuckDB, pyarrow and Spark read the value back as it was.
pub fn partition_segment(key: &str, value: Option<&str>) -> String {
    match value {
        Some(v) if !v.is_empty() => format!("{}={}", escape(key), escape(v)),
        _ => format!("{}={NULL_PARTITION}", escape(key)),
    }
}

/// Hive's escaping (its `FileUtils.escapePathName`): control characters and
/// `"#%'*/:=?\\{[]^` become `%XX`.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii_control() || "\"#%'*/:=?\\{[]^".contains(c) {
            out.push_str(&format!("%{:02X}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}
