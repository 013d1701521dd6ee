//! Live test cameras: `scripts/rtsp_server.py` (GStreamer's RTSP server, for the system
//! Python) serving a video file over RTSP.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::{free_port, repo};

pub const SYSTEM_PYTHON: &str = "/usr/bin/python3";

/// Fails (never skips) when the RTSP test server cannot run, saying how to install it.
pub fn require_rtsp_server() {
    let ok = Command::new(SYSTEM_PYTHON)
        .args([
            "-c",
            "import gi; gi.require_version('GstRtspServer', '1.0'); from gi.repository import GstRtspServer",
        ])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "GStreamer's RTSP server for {SYSTEM_PYTHON} is missing: apt-get install -y python3-gi \
         gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-base gstreamer1.0-plugins-good \
         gstreamer1.0-plugins-bad (or run scripts/setup.sh)"
    );
}

/// One live camera: `scripts/rtsp_server.py` serving `file` at rtsp://127.0.0.1:PORT/ID.
pub struct RtspCamera {
    pub id: String,
    pub file: PathBuf,
    pub port: u16,
    pub server: Option<Child>,
}

impl RtspCamera {
    pub fn start(id: &str, file: &Path) -> Self {
        let mut camera = RtspCamera {
            id: id.to_string(),
            file: file.to_path_buf(),
            port: free_port(),
            server: None,
        };
        camera.restart();
        camera
    }

    pub fn uri(&self) -> String {
        format!("rtsp://127.0.0.1:{}/{}", self.port, self.id)
    }

    /// Starts the server (again, on the same port) and waits until it listens.
    pub fn restart(&mut self) {
        let mut child = Command::new(SYSTEM_PYTHON)
            .arg(repo().join("scripts/rtsp_server.py"))
            .args(["--port", &self.port.to_string()])
            .arg(format!("{}={}", self.id, self.file.display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting scripts/rtsp_server.py");
        let mut line = String::new();
        let stdout = child.stdout.take().unwrap();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        if !line.starts_with("ready") {
            let mut err = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut err);
            panic!("rtsp_server.py for {} did not start: {line}{err}", self.id);
        }
        self.server = Some(child);
    }

    /// Kills the server (SIGKILL: an abrupt outage).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.server.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RtspCamera {
    fn drop(&mut self) {
        self.kill();
    }
}
