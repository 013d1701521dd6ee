//! The `source: { video: … }` block and the cameras it resolves to.

use std::path::{Path, PathBuf};

use riffle_dataflow::{DataflowError, DataflowResult};
use serde::{Deserialize, Deserializer};
use serde_inline_default::serde_inline_default;

/// `source: { video: { cameras | glob, batch_size, queue_size, … } }`.
#[serde_inline_default]
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VideoConfig {
    /// The cameras, one URI each, in the order that places them on workers (camera k on worker
    /// k mod workers). Either this or `glob`.
    #[serde(default)]
    pub cameras: Vec<CameraConfig>,
    /// Video files matching this pattern (`*` and `?` in the file name only), one camera each,
    /// its id the file stem, in file-name order. Either this or `cameras`.
    #[serde(default)]
    pub glob: Option<PathBuf>,
    /// Most frames per batch a worker reads.
    #[serde_inline_default(8)]
    pub batch_size: usize,
    /// Decoded frames each camera may hold ahead of the pipeline (its memory bound).
    #[serde_inline_default(8)]
    pub queue_size: usize,
    /// Keep at most this many frames a second per camera (by presentation time).
    #[serde(default)]
    pub sample_fps: Option<f64>,
    /// Keep every n-th decoded frame (frame numbers 0, n, 2n, …).
    #[serde(default)]
    pub every_nth: Option<u64>,
    /// What a camera's full queue does to a new frame; default `wait` for files, `drop_oldest`
    /// for live streams and `realtime` files.
    #[serde(default)]
    pub on_overload: Option<OnOverload>,
    /// Files only: release each frame at its presentation time from the first (like
    /// `ffmpeg -re`), so the file behaves as a live camera at its native rate.
    #[serde(default)]
    pub realtime: Option<bool>,
    /// Files only: start again at the end, frame numbers and presentation times going on
    /// (a short file feeds a long run; end it with `max_frames`).
    #[serde(default, rename = "loop")]
    pub looped: Option<bool>,
    /// Each camera ends after this many frames (those kept by `sample_fps` / `every_nth`,
    /// dropped ones included): what ends a run over live cameras.
    #[serde(default)]
    pub max_frames: Option<u64>,
    /// RTSP over `tcp` (no loss, the default) or `udp`.
    #[serde_inline_default(RtspTransport::Tcp)]
    pub rtsp_transport: RtspTransport,
    /// A live camera's connection and reads time out after this long without data.
    #[serde_inline_default(5000)]
    pub timeout_ms: u64,
    /// How much of a live stream is read to describe it (codec, size) before its first frame
    /// is decoded (FFmpeg's `analyzeduration`, 5 s by default there).
    #[serde_inline_default(500)]
    pub probe_ms: u64,
    /// Consecutive failed attempts to open a live camera (at start, or after an outage) before
    /// it is given up; a file is tried once.
    #[serde_inline_default(10)]
    pub connect_attempts: u32,
    /// Wait before the first retry, doubled after each failure up to `max_backoff_ms` (the
    /// cap), each wait shortened by up to 20% at random.
    #[serde_inline_default(500)]
    pub backoff_ms: u64,
    #[serde_inline_default(10_000)]
    pub max_backoff_ms: u64,
    /// A YAML file listing cameras (`cameras: [{ id, uri, … }]`, URIs relative to it), watched
    /// while the run goes on: cameras added to it start, cameras taken out of it stop.
    #[serde(default)]
    pub cameras_file: Option<PathBuf>,
    /// The source does not end when its cameras do: it waits for cameras added through the
    /// control API (`/api/cameras`) or `cameras_file` until the run is stopped. Default: on
    /// with `cameras_file` or when the run serves the live view (`--ui`), off otherwise.
    #[serde(default)]
    pub stay_open: Option<bool>,
    /// The bearer token the control API asks for when it listens on an address other than
    /// loopback (`${VAR}`, so it stays out of the file); without it such an address refuses
    /// changes.
    #[serde(default)]
    pub api_token: Option<String>,
    /// `auto` (the default): when the first stage is a `resize` the decoder can do itself (a
    /// CPU stretch with antialiasing, its pixels not kept), each frame goes from the decoder's
    /// YUV straight to that size in RGB in one pass, and no full-size RGB frame is made; `off`:
    /// full-size RGB frames always (the `resize` stage scales them).
    #[serde(default)]
    pub scale: ScaleMode,
    /// The size frames are scaled to while converted, when validation found the first stage
    /// lets them be (`scale: auto`); `width` and `height` still give the camera's own size.
    #[serde(skip)]
    pub scale_to: Option<(u32, u32)>,
}

/// `scale`: whether the decoder may scale frames for the first stage.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ScaleMode {
    #[default]
    Auto,
    Off,
}

/// One entry of `cameras:`; its keys override the source's for this camera.
#[derive(Clone, Debug, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct CameraConfig {
    pub id: String,
    pub uri: CameraUri,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_fps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_nth: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_overload: Option<OnOverload>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_frames: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub realtime: Option<bool>,
    #[serde(default, rename = "loop", skip_serializing_if = "Option::is_none")]
    pub looped: Option<bool>,
    /// Whether the URI is a live stream (reconnects, drops when overloaded, cannot resume);
    /// default: any URI with a scheme other than `file:`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<bool>,
}

/// What a camera does when the pipeline falls behind (`on_overload`).
#[derive(Clone, Copy, Debug, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OnOverload {
    /// Discard the oldest queued frame: the pipeline sees the freshest frames (live display).
    DropOldest,
    /// Discard the new frame: the queued ones go on.
    DropNewest,
    /// Stop decoding until there is room (files: nothing is lost).
    Wait,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RtspTransport {
    Tcp,
    Udp,
}

/// A camera's URI: a file path (resolved against the pipeline file like other sources' paths)
/// or a stream URL (`rtsp://`, `http://`, … anything FFmpeg opens).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CameraUri {
    File(PathBuf),
    Url(String),
}

impl CameraUri {
    pub fn parse(text: &str) -> CameraUri {
        if let Some(path) = text.strip_prefix("file://") {
            return CameraUri::File(PathBuf::from(path));
        }
        match text.split_once("://") {
            Some((scheme, _))
                if !scheme.is_empty()
                    && scheme
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) =>
            {
                CameraUri::Url(text.to_string())
            }
            _ => CameraUri::File(PathBuf::from(text)),
        }
    }

    /// What FFmpeg is asked to open.
    pub fn as_ffmpeg(&self) -> String {
        match self {
            CameraUri::File(p) => p.to_string_lossy().into_owned(),
            CameraUri::Url(u) => u.clone(),
        }
    }
}

impl std::fmt::Display for CameraUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CameraUri::File(p) => write!(f, "{}", p.display()),
            CameraUri::Url(u) => f.write_str(u),
        }
    }
}

impl serde::Serialize for CameraUri {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.as_ffmpeg())
    }
}

impl<'de> Deserialize<'de> for CameraUri {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(CameraUri::parse(&String::deserialize(d)?))
    }
}

/// A camera with every setting resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct Camera {
    /// Position in the source: its worker (index mod workers) and checkpoint partition.
    pub index: usize,
    pub id: String,
    pub uri: CameraUri,
    pub live: bool,
    pub on_overload: OnOverload,
    pub max_frames: Option<u64>,
    pub every_nth: u64,
    pub sample_fps: Option<f64>,
    /// Frames released at their presentation time (a file played as a live camera).
    pub realtime: bool,
    /// The file starts again at its end.
    pub looped: bool,
}

fn config_error(message: String) -> DataflowError {
    DataflowError::Config(format!("video source: {message}"))
}

impl VideoConfig {
    /// The cameras, checked (ids unique, files present, settings in range), in source order.
    pub fn resolve(&self) -> DataflowResult<Vec<Camera>> {
        if self.batch_size == 0 {
            return Err(config_error("batch_size must be at least 1".into()).at("batch_size"));
        }
        if self.queue_size == 0 {
            return Err(config_error("queue_size must be at least 1".into()).at("queue_size"));
        }
        if self.connect_attempts == 0 {
            return Err(
                config_error("connect_attempts must be at least 1".into()).at("connect_attempts")
            );
        }
        let listed = self.listed()?;
        let mut cameras: Vec<Camera> = Vec::with_capacity(listed.len());
        for (index, c) in listed.into_iter().enumerate() {
            if cameras.iter().any(|k| k.id == c.id) {
                return Err(config_error(format!("camera id `{}` is used twice", c.id)));
            }
            cameras.push(self.resolve_camera(index, c)?);
        }
        Ok(cameras)
    }

    /// Whether the source waits for more cameras when its cameras end (`stay_open`).
    pub fn stays_open(&self) -> bool {
        self.stay_open.unwrap_or(self.cameras_file.is_some())
    }

    /// The cameras listed by `cameras` or `glob` (none when the source may start empty:
    /// `cameras_file` or `stay_open`).
    pub(crate) fn listed(&self) -> DataflowResult<Vec<CameraConfig>> {
        let may_start_empty = self.cameras_file.is_some() || self.stay_open == Some(true);
        match (&self.glob, self.cameras.is_empty()) {
            (Some(_), false) => Err(config_error(
                "give either `cameras` or `glob`, not both".into(),
            )),
            (None, true) if may_start_empty => Ok(Vec::new()),
            (None, true) => Err(config_error(
                "no cameras: give `cameras: [{ id, uri }]`, `glob: <pattern>` or \
                 `cameras_file: <file>`"
                    .into(),
            )),
            (None, false) => Ok(self.cameras.clone()),
            (Some(pattern), true) => glob_cameras(pattern),
        }
    }

    /// One camera with the source's settings under its own, checked (id, file, ranges); its
    /// `index` is its checkpoint partition.
    pub(crate) fn resolve_camera(&self, index: usize, c: CameraConfig) -> DataflowResult<Camera> {
        if c.id.is_empty() {
            return Err(config_error(format!("camera {index} has an empty id")));
        }
        let live = c.live.unwrap_or(matches!(c.uri, CameraUri::Url(_)));
        if let CameraUri::File(path) = &c.uri {
            // A FIFO or device as a recorded file would block or never end: refused by name.
            let why = match std::fs::metadata(path) {
                _ if live => None,
                Ok(meta) if meta.is_file() => None,
                Ok(meta) => Some(crate::files::not_regular(path, &meta)),
                Err(e) if crate::files::is_link_loop(&e) => {
                    Some(format!("{} is a loop of symbolic links", path.display()))
                }
                Err(e) => Some(format!("{} is not a file ({e})", path.display())),
            };
            if let Some(why) = why {
                return Err(config_error(format!("camera `{}`: {why}", c.id)));
            }
        }
        let every_nth = c.every_nth.or(self.every_nth).unwrap_or(1);
        if every_nth == 0 {
            return Err(config_error(format!(
                "camera `{}`: every_nth must be at least 1",
                c.id
            )));
        }
        let sample_fps = c.sample_fps.or(self.sample_fps);
        if sample_fps.is_some_and(|f| !(f.is_finite() && f > 0.0)) {
            return Err(config_error(format!(
                "camera `{}`: sample_fps must be a positive number",
                c.id
            )));
        }
        let max_frames = c.max_frames.or(self.max_frames);
        if max_frames == Some(0) {
            return Err(config_error(format!(
                "camera `{}`: max_frames must be at least 1",
                c.id
            )));
        }
        let realtime = c.realtime.or(self.realtime).unwrap_or(false);
        let looped = c.looped.or(self.looped).unwrap_or(false);
        if live && (realtime || looped) {
            return Err(config_error(format!(
                "camera `{}`: `realtime` and `loop` apply to files, not live streams",
                c.id
            )));
        }
        Ok(Camera {
            index,
            id: c.id,
            uri: c.uri,
            live,
            realtime,
            looped,
            on_overload: c
                .on_overload
                .or(self.on_overload)
                .unwrap_or(if live || realtime {
                    OnOverload::DropOldest
                } else {
                    OnOverload::Wait
                }),
            max_frames,
            every_nth,
            sample_fps,
        })
    }

    /// Files the source reads: the listed file cameras, or the glob's directory.
    pub fn paths(&self) -> Vec<&Path> {
        let mut paths: Vec<&Path> = self
            .cameras
            .iter()
            .filter(|c| c.live != Some(true))
            .filter_map(|c| match &c.uri {
                CameraUri::File(p) => Some(p.as_path()),
                CameraUri::Url(_) => None,
            })
            .collect();
        if let Some(file) = &self.cameras_file {
            paths.push(file);
        }
        if let Some(dir) = self.glob.as_deref().and_then(Path::parent) {
            paths.push(if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            });
        }
        paths
    }

    /// Paths to resolve against the pipeline file: file cameras and the glob pattern.
    pub fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        let mut paths: Vec<&mut PathBuf> = self
            .cameras
            .iter_mut()
            .filter_map(|c| match &mut c.uri {
                CameraUri::File(p) => Some(p),
                CameraUri::Url(_) => None,
            })
            .collect();
        if let Some(glob) = self.glob.as_mut() {
            paths.push(glob);
        }
        if let Some(file) = self.cameras_file.as_mut() {
            paths.push(file);
        }
        paths
    }
}

/// Cameras for the files matching `pattern` (wildcards in the file name only), by file name.
fn glob_cameras(pattern: &Path) -> DataflowResult<Vec<CameraConfig>> {
    let name = pattern
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| config_error(format!("glob `{}` names no file", pattern.display())))?;
    let dir = match pattern.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if dir.to_string_lossy().contains(['*', '?']) {
        return Err(config_error(format!(
            "glob `{}`: wildcards are allowed in the file name only",
            pattern.display()
        )));
    }
    let listing = std::fs::read_dir(dir)
        .map_err(|e| DataflowError::io(format!("video source: listing {}", dir.display()), e))?;
    let mut files = Vec::new();
    for entry in listing {
        let entry = entry.map_err(|e| {
            DataflowError::io(format!("video source: listing {}", dir.display()), e)
        })?;
        let file = entry.file_name().to_string_lossy().into_owned();
        if wildcard_match(&name, &file) && entry.path().is_file() {
            files.push(entry.path());
        }
    }
    if files.is_empty() {
        return Err(config_error(format!(
            "no file matches `{}`",
            pattern.display()
        )));
    }
    files.sort();
    Ok(files
        .into_iter()
        .map(|path| CameraConfig {
            id: path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
            uri: CameraUri::File(path),
            sample_fps: None,
            every_nth: None,
            on_overload: None,
            max_frames: None,
            realtime: None,
            looped: None,
            live: None,
        })
        .collect())
}

/// Shell-style match of `name` against `pattern` with `*` (any run) and `?` (one character).
#[allow(
    clippy::indexing_slicing,
    reason = "`i` and `j` are checked against the lengths before each use"
)]
pub(crate) fn wildcard_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    // Classic two-pointer match with backtracking to the last `*`.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|c| *c == '*')
}
