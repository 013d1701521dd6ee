//! Model repositories (`<dir>/<version>/model.onnx`, as Triton lays them out) and the
//! process's watcher of each: new versions are found by polling, checked (the file parses, and
//! the inputs and outputs the stage maps have the types and shapes of the version the run
//! started with) and loaded once, before the run is told they are ready.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use riffle_dataflow::{DataflowError, DataflowResult};

use super::{Model, ModelConfig, Signature};

/// The file of each version inside its directory.
pub const MODEL_FILE: &str = "model.onnx";

/// The versions in `dir`: numbered subdirectories holding a `model.onnx`, lowest first.
pub fn versions(dir: &Path) -> DataflowResult<Vec<(u64, PathBuf)>> {
    let entries = std::fs::read_dir(dir).map_err(|e| DataflowError::Io {
        context: format!("model repository {}", dir.display()),
        cause: e,
    })?;
    let mut found: Vec<(u64, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u64>().ok()?;
            let file = e.path().join(MODEL_FILE);
            file.is_file().then_some((version, file))
        })
        .collect();
    found.sort();
    Ok(found)
}

/// The highest version in `dir`, or an error naming the layout expected.
pub fn latest(dir: &Path) -> DataflowResult<(u64, PathBuf)> {
    versions(dir)?.pop().ok_or_else(|| {
        DataflowError::Config(format!(
            "model repository {} has no version: expected <version>/{MODEL_FILE} under it \
             (e.g. 1/{MODEL_FILE})",
            dir.display()
        ))
        .at("path")
    })
}

/// `config` running the file `file` (one version of its repository).
pub fn config_for(config: &ModelConfig, file: &Path) -> ModelConfig {
    let mut c = config.clone();
    c.path = file.to_path_buf();
    c
}

/// Why `new` cannot replace `base` for a stage mapping `config`'s inputs and outputs, if it
/// cannot: a mapped input or output missing or of another element type or shape.
pub fn incompatibility(config: &ModelConfig, base: &Signature, new: &Signature) -> Option<String> {
    let mapped = config
        .inputs
        .keys()
        .map(|n| (n, base.input(n), new.input(n), "input"))
        .chain(
            config
                .outputs
                .keys()
                .map(|n| (n, base.output(n), new.output(n), "output")),
        );
    for (name, was, now, kind) in mapped {
        match (was, now) {
            (Some(a), Some(b)) if a.element == b.element && a.shape == b.shape => {}
            (Some(a), Some(b)) => {
                return Some(format!(
                    "{kind} `{name}` is {} where the running version has {}",
                    b.describe(),
                    a.describe()
                ))
            }
            (_, None) => return Some(format!("it has no {kind} `{name}`")),
            (None, Some(_)) => {}
        }
    }
    // The new version may need inputs the stage does not map.
    new.inputs
        .iter()
        .find(|s| !config.inputs.contains_key(&s.name))
        .map(|s| format!("it needs input `{}`, which the stage does not map", s.name))
}

/// What a watcher has found.
#[derive(Default)]
struct Found {
    /// The newest version checked and loaded, with its file.
    ready: Option<(u64, PathBuf)>,
    /// Versions refused (each logged once), with their file's size and modification time
    /// then: a file that changes since (a copy that was still being written) is tried again.
    refused: BTreeMap<u64, Option<(u64, std::time::SystemTime)>>,
}

/// Polls one repository for the process, on a thread of its own.
pub struct Watcher {
    found: Mutex<Found>,
}

static WATCHERS: Mutex<Option<HashMap<PathBuf, Weak<Watcher>>>> = Mutex::new(None);

impl Watcher {
    /// The process's watcher of `config.path`, started with the version the run begins with
    /// (`start`, already loaded by the caller) as ready.
    pub fn for_process(
        config: &ModelConfig,
        start: (u64, PathBuf),
        base: Signature,
        threads: usize,
        poll: Duration,
    ) -> DataflowResult<Arc<Watcher>> {
        let mut watchers = WATCHERS.lock().unwrap_or_else(|p| p.into_inner());
        let watchers = watchers.get_or_insert_with(HashMap::new);
        if let Some(w) = watchers.get(&config.path).and_then(Weak::upgrade) {
            return Ok(w);
        }
        let watcher = Arc::new(Watcher {
            found: Mutex::new(Found {
                ready: Some(start),
                refused: BTreeMap::new(),
            }),
        });
        let weak = Arc::downgrade(&watcher);
        let key = config.path.clone();
        let config = config.clone();
        std::thread::Builder::new()
            .name("riffle-models".into())
            .spawn(move || {
                // Ends once no stage holds the watcher.
                while let Some(w) = weak.upgrade() {
                    w.poll(&config, &base, threads);
                    drop(w);
                    std::thread::sleep(poll);
                }
            })
            .map_err(|e| DataflowError::stage("model", format!("starting its watcher: {e}")))?;
        watchers.insert(key, Arc::downgrade(&watcher));
        Ok(watcher)
    }

    /// The newest version ready to serve.
    pub fn ready(&self) -> Option<(u64, PathBuf)> {
        self.found
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ready
            .clone()
    }

    /// One look at the repository: each version newer than the ready one, newest first, is
    /// checked and loaded until one is accepted; refused versions are logged once.
    fn poll(&self, config: &ModelConfig, base: &Signature, threads: usize) {
        let (ready, refused) = {
            let found = self.found.lock().unwrap_or_else(|p| p.into_inner());
            (found.ready.as_ref().map(|r| r.0), found.refused.clone())
        };
        let Ok(all) = versions(&config.path) else {
            return;
        };
        for (version, file) in all.into_iter().rev() {
            if ready.is_some_and(|r| version <= r) {
                break;
            }
            let stamp = stamp(&file);
            if refused.get(&version) == Some(&stamp) {
                continue;
            }
            match check_and_load(config, base, &file, threads) {
                Ok(()) => {
                    tracing::info!(
                        repository = %config.path.display(),
                        version,
                        "model version loaded and checked; switching at an epoch boundary"
                    );
                    let mut found = self.found.lock().unwrap_or_else(|p| p.into_inner());
                    found.ready = Some((version, file));
                    return;
                }
                Err(reason) => {
                    tracing::warn!(
                        repository = %config.path.display(),
                        version,
                        "model version refused, the running one keeps serving: {reason}"
                    );
                    let mut found = self.found.lock().unwrap_or_else(|p| p.into_inner());
                    found.refused.insert(version, stamp);
                }
            }
        }
    }
}

/// A file's size and modification time, to notice that it changed.
fn stamp(file: &Path) -> Option<(u64, std::time::SystemTime)> {
    let meta = std::fs::metadata(file).ok()?;
    Some((meta.len(), meta.modified().ok()?))
}

/// A version is accepted when its file parses, fits the base signature, and loads.
fn check_and_load(
    config: &ModelConfig,
    base: &Signature,
    file: &Path,
    threads: usize,
) -> Result<(), String> {
    let signature = Signature::read(file).map_err(|e| e.to_string())?;
    if let Some(why) = incompatibility(config, base, &signature) {
        return Err(why);
    }
    Model::for_worker(config_for(config, file), threads, 0, &[])
        .map(drop)
        .map_err(|e| e.to_string())
}
