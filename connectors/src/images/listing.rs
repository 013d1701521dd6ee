//! Which files an images source reads and the rows they become: image files under a folder
//! (hidden ones skipped, links followed once, special files refused), their camera (folder, or
//! a contiguous segment of it) and frame number (the last digits of the name).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use riffle_dataflow::{DataflowError, DataflowResult};

use super::{ImageEntry, DEFAULT_CAMERA};

pub(super) fn is_hidden(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with('.'))
}

/// Collects image files under `dir`, following symbolic links but visiting each directory once.
/// Hidden files and directories (names starting with `.`) are skipped. A FIFO, device or socket
/// named like an image, or a loop of symbolic links, is refused by name: reading it would block
/// or fail.
pub(super) fn list_images(
    dir: &Path,
    extensions: &[String],
    visited: &mut HashSet<PathBuf>,
    files: &mut Vec<PathBuf>,
) -> DataflowResult<()> {
    let canonical = dir
        .canonicalize()
        .map_err(|e| DataflowError::io(format!("resolving {}", dir.display()), e))?;
    if !visited.insert(canonical) {
        return Ok(());
    }
    let listing = std::fs::read_dir(dir)
        .map_err(|e| DataflowError::io(format!("listing {}", dir.display()), e))?;
    for entry in listing {
        let entry =
            entry.map_err(|e| DataflowError::io(format!("listing {}", dir.display()), e))?;
        let path = entry.path();
        if is_hidden(&path) {
            continue;
        }
        // `metadata` follows links, so linked directories and files count like real ones; a
        // dangling link is skipped.
        let meta = match std::fs::metadata(&path) {
            Ok(meta) => meta,
            Err(e) if crate::files::is_link_loop(&e) => {
                return Err(DataflowError::Config(format!(
                    "images source: {} is a loop of symbolic links",
                    path.display()
                )))
            }
            Err(_) => continue,
        };
        if meta.is_dir() {
            list_images(&path, extensions, visited, files)?;
        } else if has_extension(&path, extensions) {
            if !meta.is_file() {
                return Err(DataflowError::Config(format!(
                    "images source: {}",
                    crate::files::not_regular(&path, &meta)
                )));
            }
            files.push(path);
        }
    }
    Ok(())
}

pub(super) fn has_extension(path: &Path, extensions: &[String]) -> bool {
    path.extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .is_some_and(|e| extensions.contains(&e))
}

/// The last run of ASCII digits in the file stem, if any (and if it fits an i64).
pub(super) fn frame_number(path: &Path) -> Option<i64> {
    let stem = path.file_stem()?.to_string_lossy().into_owned();
    let end = stem.rfind(|c: char| c.is_ascii_digit())? + 1;
    let start = stem[..end]
        .rfind(|c: char| !c.is_ascii_digit())
        .map_or(0, |i| i + 1);
    stem[start..end].parse().ok()
}

/// The camera directory of `file`: its parent relative to `root`, with `/` separators; for a
/// file directly in `root`, the name of `root` itself (its parent directory).
pub(super) fn camera_dir(root: &Path, file: &Path) -> String {
    let parent = file
        .parent()
        .and_then(|p| p.strip_prefix(root).ok())
        .map(|rel| {
            rel.components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("/")
        })
        .unwrap_or_default();
    if !parent.is_empty() {
        return parent;
    }
    root.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .or_else(|| {
            root.canonicalize()
                .ok()
                .and_then(|r| r.file_name().map(|n| n.to_string_lossy().into_owned()))
        })
        .unwrap_or_else(|| DEFAULT_CAMERA.to_string())
}

/// Segment of file `i` among `n` split into `segments` contiguous, nearly equal parts.
pub(super) fn segment(i: usize, n: usize, segments: usize) -> usize {
    (i as u128 * segments as u128 / n as u128) as usize
}

/// Index of the first file of `segment` among `n` files split into `segments` parts.
pub(super) fn segment_start(segment: usize, n: usize, segments: usize) -> usize {
    (segment as u128 * n as u128).div_ceil(segments as u128) as usize
}

/// Rows for `files`, in reading order: by camera directory, then by path.
pub(super) fn assign_cameras(
    root: &Path,
    files: Vec<PathBuf>,
    cameras: Option<usize>,
) -> Vec<ImageEntry> {
    let mut files: Vec<(String, PathBuf)> = files
        .into_iter()
        .map(|f| (camera_dir(root, &f), f))
        .collect();
    // Sorting by directory first keeps each camera's files together even when a directory
    // holds both files and subdirectories.
    files.sort();
    let mut groups: Vec<(String, Vec<PathBuf>)> = Vec::new();
    for (dir, file) in files {
        match groups.last_mut() {
            Some((last, group)) if *last == dir => group.push(file),
            _ => groups.push((dir, vec![file])),
        }
    }
    let mut entries = Vec::new();
    for (dir, group) in groups {
        let n = group.len();
        for (i, path) in group.into_iter().enumerate() {
            let (camera_id, position) = match cameras {
                Some(segments) => {
                    let k = segment(i, n, segments);
                    (format!("{dir}-{k}"), i - segment_start(k, n, segments))
                }
                None => (dir.clone(), i),
            };
            // Position within the camera when the name has no number.
            let frame = frame_number(&path).unwrap_or(position as i64);
            entries.push(ImageEntry {
                path,
                camera_id,
                frame,
            });
        }
    }
    entries
}
