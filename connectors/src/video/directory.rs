//! The video source's camera set while it runs: cameras added and removed through the
//! control API (`/api/cameras`, [`InputControl`]) or a watched `cameras_file`, each placed on
//! the least-loaded worker. The partitions read it before each batch; checkpoints keep it.
//!
//! In a cluster, process 0 holds the set and places cameras on every process's workers; the
//! others follow its snapshot ([`InputControl::apply`]), so all place alike.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use riffle_dataflow::control::{ControlError, InputControl};
use riffle_dataflow::{DataflowError, DataflowResult};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::config::{Camera, CameraConfig, CameraUri, VideoConfig};

/// How often the cameras file is looked at.
const WATCH_EVERY: Duration = Duration::from_millis(500);

/// Where a camera came from: the pipeline file, the cameras file or the API. The cameras file
/// adds and removes only its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Origin {
    Pipeline,
    File,
    Api,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Entry {
    spec: CameraConfig,
    /// Its checkpoint partition: given once, never reused.
    index: usize,
    /// The worker (of all processes) that reads it; `None` until the workers are known.
    worker: Option<usize>,
    origin: Origin,
}

/// What a checkpoint and process 0's snapshot hold.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Set {
    cameras: BTreeMap<String, Entry>,
    next_index: usize,
    workers: Option<usize>,
    /// The worker each removed id was on: an id added back goes there, so its new frames
    /// come after its old state was dropped (keyed stages drop it in order, per worker).
    #[serde(default)]
    was_on: BTreeMap<String, usize>,
}

/// The camera set of one source, shared by its partitions, its resumed copies and the
/// endpoints.
pub(crate) struct Directory {
    config: VideoConfig,
    set: Mutex<Set>,
    /// Resolved cameras by id (kept apart: a `Camera` is not what is checkpointed).
    resolved: Mutex<BTreeMap<String, Camera>>,
    /// Bumped on every change; partitions compare it with the one they last read.
    version: AtomicU64,
    /// Waits for cameras added later instead of ending with its cameras.
    open: AtomicBool,
    /// Another process holds the set (this one follows its snapshots).
    follower: AtomicBool,
    /// The cameras file's last seen change (modified time, length).
    file_seen: Mutex<Option<(SystemTime, u64)>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A cameras file: `cameras: [{ id, uri, … }]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CamerasFile {
    #[serde(default)]
    cameras: Vec<CameraConfig>,
}

impl Directory {
    /// The set of `config`'s cameras (and its cameras file's), none placed yet; watches the
    /// cameras file from a thread of its own while the directory lives.
    pub fn new(config: &VideoConfig) -> DataflowResult<Arc<Self>> {
        let cameras = config.resolve()?;
        let mut set = Set::default();
        let mut resolved = BTreeMap::new();
        let listed = config.listed()?;
        for (spec, camera) in listed.into_iter().zip(cameras) {
            set.next_index = camera.index + 1;
            set.cameras.insert(
                camera.id.clone(),
                Entry {
                    spec,
                    index: camera.index,
                    worker: None,
                    origin: Origin::Pipeline,
                },
            );
            resolved.insert(camera.id.clone(), camera);
        }
        let directory = Arc::new(Directory {
            config: config.clone(),
            set: Mutex::new(set),
            resolved: Mutex::new(resolved),
            version: AtomicU64::new(0),
            open: AtomicBool::new(config.stays_open()),
            follower: AtomicBool::new(false),
            file_seen: Mutex::new(None),
        });
        if let Some(file) = &config.cameras_file {
            // A bad file at the start is a configuration error, named by the file.
            directory
                .read_cameras_file(file)
                .map_err(|e| DataflowError::Config(e.to_string()).at("cameras_file"))?;
            watch(Arc::downgrade(&directory), file.clone());
        }
        Ok(directory)
    }

    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed)
    }

    /// Every camera, in index order.
    pub fn cameras(&self) -> Vec<Camera> {
        let mut all: Vec<Camera> = lock(&self.resolved).values().cloned().collect();
        all.sort_by_key(|c| c.index);
        all
    }

    /// The cameras worker `worker` of `peers` reads, with the version they are of. The first
    /// call with a worker count places every camera.
    pub fn cameras_of(&self, worker: usize, peers: usize) -> (u64, Vec<Camera>) {
        let mut set = lock(&self.set);
        if set.workers != Some(peers) && !self.follower.load(Ordering::Relaxed) {
            place_all(&mut set, peers);
        }
        let version = self.version();
        let mine: BTreeSet<&str> = set
            .cameras
            .iter()
            .filter(|(_, e)| e.worker.unwrap_or(e.index % peers.max(1)) == worker)
            .map(|(id, _)| id.as_str())
            .collect();
        let resolved = lock(&self.resolved);
        let mut cameras: Vec<Camera> = mine
            .iter()
            .filter_map(|id| resolved.get(*id).cloned())
            .collect();
        cameras.sort_by_key(|c| c.index);
        (version, cameras)
    }

    fn changed(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// Adds `spec` (URIs relative to `base`) unless its id is taken; places it.
    fn insert(
        &self,
        mut spec: CameraConfig,
        origin: Origin,
        base: Option<&Path>,
    ) -> Result<Value, ControlError> {
        if spec.id.is_empty() || spec.id.contains(['/', '?', '#']) || spec.id.len() > 200 {
            return Err(ControlError::BadRequest(format!(
                "camera id `{}`: give 1 to 200 characters without `/`, `?` or `#`",
                spec.id
            )));
        }
        if let (CameraUri::File(path), Some(base)) = (&mut spec.uri, base) {
            if path.is_relative() {
                *path = base.join(&*path);
            }
        }
        let mut set = lock(&self.set);
        if set.cameras.contains_key(&spec.id) {
            return Err(ControlError::Conflict(format!(
                "a camera with id `{}` is already running",
                spec.id
            )));
        }
        let index = set.next_index;
        let camera = self
            .config
            .resolve_camera(index, spec.clone())
            .map_err(|e| ControlError::BadRequest(e.to_string()))?;
        let worker = set.workers.map(|peers| match set.was_on.get(&spec.id) {
            Some(&w) if w < peers => w,
            _ => least_loaded(&set, peers),
        });
        set.next_index += 1;
        let entry = Entry {
            spec,
            index,
            worker,
            origin,
        };
        let listed = listed(&entry, &camera);
        set.cameras.insert(camera.id.clone(), entry);
        lock(&self.resolved).insert(camera.id.clone(), camera);
        drop(set);
        self.changed();
        tracing::info!("camera added ({origin:?}): {listed}");
        Ok(listed)
    }

    fn take_out(&self, id: &str, origin: Option<Origin>) -> Result<Value, ControlError> {
        let mut set = lock(&self.set);
        match set.cameras.get(id) {
            None => {
                return Err(ControlError::NotFound(format!("no camera with id `{id}`")));
            }
            Some(e) if origin.is_some_and(|o| o != e.origin) => {
                return Err(ControlError::Conflict(format!(
                    "camera `{id}` is not the cameras file's"
                )));
            }
            Some(_) => {}
        }
        let entry = set.cameras.remove(id);
        if let Some(w) = entry.as_ref().and_then(|e| e.worker) {
            set.was_on.insert(id.to_string(), w);
        }
        let camera = lock(&self.resolved).remove(id);
        drop(set);
        self.changed();
        tracing::info!("camera `{id}` removed");
        Ok(match (entry, camera) {
            (Some(e), Some(c)) => listed(&e, &c),
            _ => json!({ "id": id }),
        })
    }

    fn refuse_if_follower(&self) -> Result<(), ControlError> {
        if self.follower.load(Ordering::Relaxed) {
            return Err(ControlError::Conflict(
                "process 0 holds the camera set: send changes to its view".into(),
            ));
        }
        Ok(())
    }

    /// Makes the cameras file's cameras those of `file` (when it changed since last read).
    fn read_cameras_file(&self, file: &Path) -> Result<(), ControlError> {
        let meta = std::fs::metadata(file).map_err(|e| {
            ControlError::BadRequest(format!("cameras_file {}: {e}", file.display()))
        })?;
        let stamp = (
            meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            meta.len(),
        );
        if *lock(&self.file_seen) == Some(stamp) {
            return Ok(());
        }
        // Seen before it is read: a broken version is reported once, not on every look.
        *lock(&self.file_seen) = Some(stamp);
        let text = std::fs::read_to_string(file).map_err(|e| {
            ControlError::BadRequest(format!("cameras_file {}: {e}", file.display()))
        })?;
        let parsed: CamerasFile = serde_saphyr::from_str(&text).map_err(|e| {
            ControlError::BadRequest(format!(
                "cameras_file {}: expected `cameras: [{{ id, uri, … }}]`: {e}",
                file.display()
            ))
        })?;
        if self.follower.load(Ordering::Relaxed) {
            return Ok(());
        }
        let base = file.parent().map(Path::to_path_buf).unwrap_or_default();
        let wanted: BTreeMap<String, CameraConfig> = parsed
            .cameras
            .into_iter()
            .map(|mut c| {
                if let CameraUri::File(p) = &mut c.uri {
                    if p.is_relative() {
                        *p = base.join(&*p);
                    }
                }
                (c.id.clone(), c)
            })
            .collect();
        let current: BTreeMap<String, CameraConfig> = lock(&self.set)
            .cameras
            .iter()
            .filter(|(_, e)| e.origin == Origin::File)
            .map(|(id, e)| (id.clone(), e.spec.clone()))
            .collect();
        for (id, spec) in &current {
            if wanted.get(id) != Some(spec) {
                self.take_out(id, Some(Origin::File))?;
            }
        }
        let mut refused = Vec::new();
        for (id, spec) in wanted {
            if current.get(&id) == Some(&spec) {
                continue;
            }
            if let Err(e) = self.insert(spec, Origin::File, None) {
                refused.push(format!("camera `{id}`: {e}"));
            }
        }
        if refused.is_empty() {
            Ok(())
        } else {
            Err(ControlError::BadRequest(format!(
                "cameras_file {}: {}",
                file.display(),
                refused.join("; ")
            )))
        }
    }
}

/// Places every camera for `peers` workers: the pipeline's cameras by index (camera k on
/// worker k mod workers, as without a directory), the others on the least-loaded worker.
fn place_all(set: &mut Set, peers: usize) {
    let peers = peers.max(1);
    set.workers = Some(peers);
    for e in set.cameras.values_mut() {
        e.worker = (e.origin == Origin::Pipeline).then_some(e.index % peers);
    }
    let mut rest: Vec<(usize, String)> = set
        .cameras
        .iter()
        .filter(|(_, e)| e.worker.is_none())
        .map(|(id, e)| (e.index, id.clone()))
        .collect();
    rest.sort();
    for (_, id) in rest {
        let worker = least_loaded(set, peers);
        if let Some(e) = set.cameras.get_mut(&id) {
            e.worker = Some(worker);
        }
    }
}

/// The worker with the fewest cameras (the lowest such index).
fn least_loaded(set: &Set, peers: usize) -> usize {
    let mut load = vec![0usize; peers.max(1)];
    for e in set.cameras.values() {
        if let Some(slot) = e.worker.and_then(|w| load.get_mut(w)) {
            *slot += 1;
        }
    }
    load.iter()
        .enumerate()
        .min_by_key(|(w, n)| (**n, *w))
        .map_or(0, |(w, _)| w)
}

/// A camera as `GET /api/cameras` lists it (a URL's password hidden).
fn listed(entry: &Entry, camera: &Camera) -> Value {
    json!({
        "id": camera.id,
        "uri": redacted(&camera.uri),
        "live": camera.live,
        "index": entry.index,
        "worker": entry.worker,
        "origin": entry.origin,
    })
}

fn redacted(uri: &CameraUri) -> String {
    match uri {
        CameraUri::File(p) => p.display().to_string(),
        CameraUri::Url(u) => match (u.find("://"), u.find('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                let auth = &u[scheme + 3..at];
                match auth.split_once(':') {
                    Some((user, _)) => format!("{}{user}:***{}", &u[..scheme + 3], &u[at..]),
                    None => u.clone(),
                }
            }
            _ => u.clone(),
        },
    }
}

/// Reads the cameras file every [`WATCH_EVERY`] while the directory lives; a bad version is
/// logged with the reason and changes nothing.
fn watch(directory: Weak<Directory>, file: PathBuf) {
    let shown = file.display().to_string();
    let spawned = std::thread::Builder::new()
        .name("video-cameras-file".into())
        .spawn(move || loop {
            std::thread::sleep(WATCH_EVERY);
            let Some(directory) = directory.upgrade() else {
                return;
            };
            if let Err(e) = directory.read_cameras_file(&file) {
                tracing::error!("{e}; the cameras it lists as they are stay as they were");
            }
        });
    if let Err(e) = spawned {
        tracing::error!("cameras_file {shown}: no thread to watch it: {e}");
    }
}

impl InputControl for Directory {
    fn noun(&self) -> &'static str {
        "cameras"
    }

    fn list(&self) -> Value {
        let set = lock(&self.set);
        let resolved = lock(&self.resolved);
        let mut entries: Vec<&Entry> = set.cameras.values().collect();
        entries.sort_by_key(|e| e.index);
        Value::Array(
            entries
                .into_iter()
                .filter_map(|e| resolved.get(&e.spec.id).map(|c| listed(e, c)))
                .collect(),
        )
    }

    fn add(&self, spec: Value) -> Result<Value, ControlError> {
        self.refuse_if_follower()?;
        if !self.is_open() {
            return Err(ControlError::Conflict(
                "this source ends when its cameras do (source.video.stay_open is false): set \
                 `stay_open: true` or `cameras_file` to add cameras while it runs"
                    .into(),
            ));
        }
        let spec: CameraConfig = serde_json::from_value(spec).map_err(|e| {
            ControlError::BadRequest(format!(
                "expected a camera {{ \"id\": …, \"uri\": …, and optionally sample_fps, \
                 every_nth, on_overload, max_frames, realtime, loop, live }}: {e}"
            ))
        })?;
        let base = std::env::current_dir().ok();
        self.insert(spec, Origin::Api, base.as_deref())
    }

    fn remove(&self, id: &str) -> Result<Value, ControlError> {
        self.refuse_if_follower()?;
        self.take_out(id, None)
    }

    fn watched_file(&self) -> Option<PathBuf> {
        self.config.cameras_file.clone()
    }

    fn token(&self) -> Option<String> {
        self.config.api_token.clone().filter(|t| !t.is_empty())
    }

    fn keep_open(&self) {
        if self.config.stay_open.is_none() {
            self.open.store(true, Ordering::Relaxed);
        }
    }

    fn snapshot(&self) -> Value {
        serde_json::to_value(&*lock(&self.set)).unwrap_or(Value::Null)
    }

    fn apply(&self, snapshot: &Value) -> Result<(), ControlError> {
        let theirs: Set = serde_json::from_value(snapshot.clone())
            .map_err(|e| ControlError::BadRequest(format!("camera set snapshot: {e}")))?;
        self.follower.store(true, Ordering::Relaxed);
        self.replace(theirs);
        Ok(())
    }
}

impl Directory {
    /// Takes `theirs` as the set (process 0's snapshot, or a checkpoint's), keeping what is
    /// unchanged; a camera that does not resolve here is logged and left out.
    fn replace(&self, theirs: Set) {
        let mut set = lock(&self.set);
        let same = set.workers == theirs.workers
            && set.next_index == theirs.next_index
            && set.cameras.len() == theirs.cameras.len()
            && set.cameras.iter().all(|(id, e)| {
                theirs
                    .cameras
                    .get(id)
                    .is_some_and(|t| t.index == e.index && t.worker == e.worker && t.spec == e.spec)
            });
        if same {
            return;
        }
        let mut resolved = lock(&self.resolved);
        let mut next = BTreeMap::new();
        for (id, e) in &theirs.cameras {
            let kept = resolved
                .get(id)
                .filter(|c| {
                    c.index == e.index && set.cameras.get(id).is_some_and(|o| o.spec == e.spec)
                })
                .cloned();
            match kept.map_or_else(|| self.config.resolve_camera(e.index, e.spec.clone()), Ok) {
                Ok(c) => {
                    next.insert(id.clone(), c);
                }
                Err(err) => tracing::error!("camera `{id}` cannot run in this process: {err}"),
            }
        }
        *resolved = next;
        *set = theirs;
        drop(resolved);
        drop(set);
        self.changed();
    }

    /// Removed cameras that were on `worker` of `peers` (not added back). A checkpoint's set
    /// is read as it is written, so it can leave out a camera removed after the checkpoint's
    /// epoch whose keyed state that epoch still holds: a run resumed from it retires them
    /// again (retiring an id with no state does nothing).
    pub fn removed_from(&self, worker: usize, peers: usize) -> Vec<String> {
        let set = lock(&self.set);
        set.was_on
            .iter()
            .filter(|(id, on)| !set.cameras.contains_key(*id) && **on % peers.max(1) == worker)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// The set as a checkpoint keeps it.
    pub fn checkpoint_state(&self) -> String {
        self.snapshot().to_string()
    }

    /// The set a checkpoint kept (the workers placed anew when their number changed).
    pub fn restore(&self, state: &str) -> DataflowResult<()> {
        let set: Set = serde_json::from_str(state)
            .map_err(|e| DataflowError::Config(format!("checkpointed camera set: {e}")))?;
        tracing::info!(
            "resuming with the checkpointed camera set: {}",
            set.cameras.keys().cloned().collect::<Vec<_>>().join(", ")
        );
        self.replace(set);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> VideoConfig {
        serde_saphyr::from_str(yaml).unwrap()
    }

    fn clip() -> String {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        repo.join("data/videos/live/bikes-0.mp4")
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn new_cameras_go_to_the_least_loaded_worker_and_keep_their_index() {
        let d = Directory::new(&config(&format!(
            "{{ cameras: [{{ id: a, uri: '{0}' }}, {{ id: b, uri: '{0}' }}, {{ id: c, uri: '{0}' }}], stay_open: true }}",
            clip()
        )))
        .unwrap();
        // 3 cameras on 2 workers: worker 1 has one camera, worker 0 two.
        assert_eq!(d.cameras_of(1, 2).1.len(), 1);
        let before = d.version();
        let added = d.add(json!({ "id": "d", "uri": clip() })).unwrap();
        assert_eq!(added["worker"], 1, "{added}");
        assert_eq!(added["index"], 3);
        assert!(d.version() > before);
        let ids = |w| {
            d.cameras_of(w, 2)
                .1
                .into_iter()
                .map(|c| c.id)
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(1), ["b", "d"]);
        d.remove("a").unwrap();
        // Worker 0 now has one camera: the next goes there; indices are never reused.
        let e = d.add(json!({ "id": "e", "uri": clip() })).unwrap();
        assert_eq!(
            (e["worker"].as_u64(), e["index"].as_u64()),
            (Some(0), Some(4))
        );
    }

    #[test]
    fn bad_requests_change_nothing() {
        let d = Directory::new(&config(&format!(
            "{{ cameras: [{{ id: a, uri: '{}' }}], stay_open: true }}",
            clip()
        )))
        .unwrap();
        let v = d.version();
        let taken = d.add(json!({ "id": "a", "uri": clip() })).unwrap_err();
        assert!(matches!(taken, ControlError::Conflict(_)), "{taken}");
        let missing = d
            .add(json!({ "id": "m", "uri": "/no/such/clip.mp4" }))
            .unwrap_err();
        assert!(
            missing.to_string().contains("/no/such/clip.mp4"),
            "{missing}"
        );
        let unknown = d
            .add(json!({ "id": "x", "uri": clip(), "fps": 3 }))
            .unwrap_err();
        assert!(unknown.to_string().contains("fps"), "{unknown}");
        let slash = d.add(json!({ "id": "a/b", "uri": clip() })).unwrap_err();
        assert!(matches!(slash, ControlError::BadRequest(_)), "{slash}");
        assert!(matches!(d.remove("zz"), Err(ControlError::NotFound(_))));
        assert_eq!(d.version(), v);
        assert_eq!(d.list().as_array().unwrap().len(), 1);
    }

    #[test]
    fn a_source_that_ends_with_its_cameras_refuses_new_ones_until_kept_open() {
        let d = Directory::new(&config(&format!(
            "{{ cameras: [{{ id: a, uri: '{}' }}] }}",
            clip()
        )))
        .unwrap();
        assert!(matches!(
            d.add(json!({ "id": "b", "uri": clip() })),
            Err(ControlError::Conflict(_))
        ));
        d.keep_open();
        d.add(json!({ "id": "b", "uri": clip() })).unwrap();
    }

    #[test]
    fn the_checkpointed_set_comes_back_with_its_indices() {
        let yaml = format!(
            "{{ cameras: [{{ id: a, uri: '{}' }}], stay_open: true }}",
            clip()
        );
        let d = Directory::new(&config(&yaml)).unwrap();
        d.cameras_of(0, 2);
        d.add(json!({ "id": "b", "uri": clip() })).unwrap();
        d.remove("a").unwrap();
        let state = d.checkpoint_state();
        let again = Directory::new(&config(&yaml)).unwrap();
        again.restore(&state).unwrap();
        let cams = again.cameras();
        assert_eq!(cams.len(), 1);
        assert_eq!((cams[0].id.as_str(), cams[0].index), ("b", 1));
        // The removed camera is retired again by the worker it was on, whose keyed state may
        // still hold it at the checkpoint's epoch.
        assert_eq!(again.removed_from(0, 2), ["a"]);
        assert!(again.removed_from(1, 2).is_empty());
        again.add(json!({ "id": "a", "uri": clip() })).unwrap();
        assert!(
            again.removed_from(0, 2).is_empty(),
            "added back: not retired"
        );
    }

    #[test]
    fn followers_take_process_zeros_placement_and_refuse_changes() {
        let yaml = format!(
            "{{ cameras: [{{ id: a, uri: '{}' }}], stay_open: true }}",
            clip()
        );
        let zero = Directory::new(&config(&yaml)).unwrap();
        zero.cameras_of(0, 4);
        zero.add(json!({ "id": "b", "uri": clip() })).unwrap();
        let peer = Directory::new(&config(&yaml)).unwrap();
        peer.apply(&zero.snapshot()).unwrap();
        let (_, on_1) = peer.cameras_of(1, 4);
        assert_eq!(
            on_1.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
            ["b"]
        );
        assert!(matches!(
            peer.add(json!({ "id": "c", "uri": clip() })),
            Err(ControlError::Conflict(_))
        ));
    }

    #[test]
    fn urls_are_listed_without_their_password() {
        let u = CameraUri::Url("rtsp://admin:secret@10.0.0.5:554/stream".into());
        assert_eq!(redacted(&u), "rtsp://admin:***@10.0.0.5:554/stream");
    }

    #[test]
    fn the_cameras_file_adds_and_removes_its_own_cameras() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("cams.yaml");
        std::fs::write(
            &file,
            format!("cameras: [{{ id: f1, uri: '{}' }}]\n", clip()),
        )
        .unwrap();
        let d = Directory::new(&config(&format!(
            "{{ cameras_file: '{}' }}",
            file.display()
        )))
        .unwrap();
        assert!(d.is_open());
        d.add(json!({ "id": "api", "uri": clip() })).unwrap();
        std::fs::write(
            &file,
            format!(
                "cameras: [{{ id: f2, uri: '{0}' }}, {{ id: f3, uri: '{0}' }}]\n# changed\n",
                clip()
            ),
        )
        .unwrap();
        d.read_cameras_file(&file).unwrap();
        let ids: Vec<String> = d.cameras().into_iter().map(|c| c.id).collect();
        assert_eq!(ids, ["api", "f2", "f3"]);
        // A broken version changes nothing and says why.
        std::fs::write(&file, "cameras: [{ id: f4 }]\n").unwrap();
        let e = d.read_cameras_file(&file).unwrap_err();
        assert!(e.to_string().contains("uri"), "{e}");
        assert_eq!(d.cameras().len(), 3);
    }
}
