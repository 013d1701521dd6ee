//! `/video/{camera}/live/…`: the annotated video a `video` sink writes as HLS (an `index.m3u8`
//! playlist of fragmented-MP4 segments per camera), served from its folder so the page plays it
//! (Media Source Extensions in `app.js`: no player library).

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Path as UrlPath, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// The routes serving `dir` at `/video/`.
pub(crate) fn routes<S: Clone + Send + Sync + 'static>(dir: PathBuf) -> Router<S> {
    Router::new()
        .route("/video/{*path}", get(file))
        .with_state(Arc::new(dir))
}

/// `path` inside `dir`, or `None` when it would leave it (`..`, absolute, odd components).
fn inside(dir: &Path, path: &str) -> Option<PathBuf> {
    let relative = Path::new(path);
    relative
        .components()
        .all(|c| matches!(c, Component::Normal(_)))
        .then(|| dir.join(relative))
}

fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()) {
        Some("m3u8") => "application/vnd.apple.mpegurl",
        Some("mp4" | "m4s") => "video/mp4",
        _ => "application/octet-stream",
    }
}

async fn file(State(dir): State<Arc<PathBuf>>, UrlPath(path): UrlPath<String>) -> Response {
    let Some(file) = inside(&dir, &path) else {
        return (StatusCode::BAD_REQUEST, "no such video path\n").into_response();
    };
    match tokio::fs::read(&file).await {
        // FFmpeg creates a playlist and init segment empty and fills them later.
        Ok(bytes) if !bytes.is_empty() => (
            [
                (header::CONTENT_TYPE, content_type(&file)),
                // The playlist changes every segment; segments never do.
                (header::CACHE_CONTROL, "no-store"),
            ],
            bytes,
        )
            .into_response(),
        _ => (StatusCode::NOT_FOUND, "no such video file (yet)\n").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside_the_folder() {
        let dir = Path::new("/srv/video");
        assert_eq!(
            inside(dir, "cam-1/live/index.m3u8"),
            Some(PathBuf::from("/srv/video/cam-1/live/index.m3u8"))
        );
        assert_eq!(inside(dir, "../etc/passwd"), None);
        assert_eq!(inside(dir, "cam/../../x"), None);
        assert_eq!(inside(dir, "/etc/passwd"), None);
        assert_eq!(content_type(Path::new("a/seg-00001.m4s")), "video/mp4");
    }
}
