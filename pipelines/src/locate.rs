//! Finding a field of the pipeline file from its key path, for error messages.

use std::path::Path;

use crate::error::PipelineError;

/// The parser's message without its own location prefix and source snippet (we print ours).
pub(crate) fn parser_message(text: &str) -> String {
    let first = text.lines().next().unwrap_or(text).trim();
    let rest = first.strip_prefix("error:").unwrap_or(first).trim();
    match rest.strip_prefix("line ").and_then(|r| r.split_once(": ")) {
        Some((_, message)) => message.to_string(),
        None => rest.to_string(),
    }
}

/// Locates fields inside the pipeline text for error messages.
pub(crate) struct Locator<'a> {
    pub(crate) file: &'a Path,
    pub(crate) lines: Vec<&'a str>,
}

impl Locator<'_> {
    /// An error at `line`, or at the line of `key:` within the block that starts there.
    pub(crate) fn error(
        &self,
        start: Option<u64>,
        key: Option<&str>,
        field: String,
        message: String,
    ) -> PipelineError {
        let line = match (start, key) {
            (Some(start), Some(key)) => Some(self.find_key(start, key).unwrap_or(start)),
            (start, _) => start,
        };
        PipelineError {
            file: self.file.to_path_buf(),
            line,
            field,
            message,
        }
    }

    /// First line at or after `start` holding `key:` before the block ends (a line indented
    /// no deeper than the block's first line that starts a new entry).
    pub(crate) fn find_key(&self, start: u64, key: &str) -> Option<u64> {
        let first = (start as usize).checked_sub(1)?;
        let indent = |l: &str| l.len() - l.trim_start().len();
        let base = indent(self.lines.get(first)?);
        let needles = [
            format!("{key}:"),
            format!("\"{key}\":"),
            format!("'{key}':"),
        ];
        for (i, line) in self.lines.iter().enumerate().skip(first) {
            let trimmed = line.trim_start();
            if i > first && !trimmed.is_empty() && !trimmed.starts_with('#') && indent(line) <= base
            {
                break;
            }
            if needles.iter().any(|n| contains_key(line, n)) {
                return Some(i as u64 + 1);
            }
        }
        None
    }
}

#[allow(
    clippy::indexing_slicing,
    reason = "`at - 1` is read only when `at > 0`, and `at` is an index of `line`"
)]
fn contains_key(line: &str, needle: &str) -> bool {
    line.match_indices(needle).any(|(at, _)| {
        at == 0 || matches!(line.as_bytes()[at - 1], b' ' | b'{' | b',' | b'-' | b'\t')
    })
}

impl Locator<'_> {
    /// The line of a dotted key path (`batch.max_size`, `inputs."image_tensor:0"`) inside the
    /// block that starts at `start`: each key is looked for inside the block of the previous.
    pub(crate) fn find_path(&self, start: u64, path: &str) -> Option<u64> {
        let mut line = start;
        for key in split_path(path) {
            line = self.find_key(line, &key)?;
        }
        Some(line)
    }
}

/// `a."b.c".d` → `a`, `b.c`, `d`.
pub(crate) fn split_path(path: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let mut key = String::new();
    let mut quoted = false;
    for c in path.chars() {
        match c {
            '"' => quoted = !quoted,
            '.' if !quoted => keys.push(std::mem::take(&mut key)),
            c => key.push(c),
        }
    }
    keys.push(key);
    keys
}
