//! Opening input files: only regular files are read. A FIFO, a device (`/dev/zero`) or a
//! socket would block or never end, so it is refused by name when the source is opened.

use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use riffle_dataflow::{DataflowError, DataflowResult};

/// What a file that is neither a regular file nor a directory is, in words.
fn special_kind(meta: &Metadata) -> Option<&'static str> {
    let t = meta.file_type();
    if t.is_fifo() {
        Some("a FIFO (named pipe)")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_block_device() {
        Some("a block device")
    } else if t.is_socket() {
        Some("a socket")
    } else {
        None
    }
}

/// Why `path` (already found not to be a regular file) cannot be read as one.
pub(crate) fn not_regular(path: &Path, meta: &Metadata) -> String {
    match special_kind(meta) {
        Some(kind) => format!("{} is {kind}, not a regular file", path.display()),
        None if meta.is_dir() => format!("{} is a directory, not a regular file", path.display()),
        None => format!("{} is not a regular file", path.display()),
    }
}

/// Whether an error means a loop of symbolic links.
pub(crate) fn is_link_loop(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ELOOP)
}

/// Opens a regular file for reading: a FIFO is opened without waiting for a writer and then
/// refused, like a device or socket; a loop of symbolic links is named as such.
pub(crate) fn open_regular(path: &Path) -> DataflowResult<(File, Metadata)> {
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path);
    let file = match opened {
        Ok(file) => file,
        Err(e) if is_link_loop(&e) => {
            return Err(DataflowError::Config(format!(
                "{} is a loop of symbolic links",
                path.display()
            )))
        }
        Err(e) => return Err(DataflowError::io(format!("opening {}", path.display()), e)),
    };
    let meta = file
        .metadata()
        .map_err(|e| DataflowError::io(format!("reading {}", path.display()), e))?;
    if !meta.is_file() {
        return Err(DataflowError::Config(not_regular(path, &meta)));
    }
    Ok((file, meta))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_files_and_link_loops_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe.csv");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Returns at once although no writer exists.
        let e = open_regular(&fifo).unwrap_err().to_string();
        assert!(e.contains("pipe.csv is a FIFO (named pipe)"), "{e}");

        let e = open_regular(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "/dev/zero is a character device, not a regular file");

        let a = dir.path().join("a.csv");
        let b = dir.path().join("b.csv");
        std::os::unix::fs::symlink(&b, &a).unwrap();
        std::os::unix::fs::symlink(&a, &b).unwrap();
        let e = open_regular(&a).unwrap_err().to_string();
        assert!(e.contains("a.csv is a loop of symbolic links"), "{e}");

        let e = open_regular(dir.path()).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");

        let file = dir.path().join("ok.csv");
        std::fs::write(&file, "a\n1\n").unwrap();
        assert_eq!(open_regular(&file).unwrap().1.len(), 4);
    }
}
