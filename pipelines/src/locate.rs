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

/// Whether `line` writes `key:` (plain or quoted).
pub(crate) fn holds_key(line: &str, key: &str) -> bool {
    [
        format!("{key}:"),
        format!("\"{key}\":"),
        format!("'{key}':"),
    ]
    .iter()
    .any(|n| contains_key(line, n))
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

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

fn is_item(line: &str) -> bool {
    let t = line.trim_start();
    t == "-" || t.starts_with("- ")
}

fn blank(line: &str) -> bool {
    let t = line.trim_start();
    t.is_empty() || t.starts_with('#')
}

/// The block key a line opens (`model` of `  - model:`), unquoted.
fn key_of(line: &str) -> String {
    let t = line.trim_start();
    let t = t.strip_prefix('-').unwrap_or(t).trim_start();
    let key = t.split_once(':').map_or(t, |(k, _)| k);
    key.trim().trim_matches(['"', '\'']).to_string()
}

impl Locator<'_> {
    /// The dotted path of the value at `line` and `column` (1-based, as the parser reports
    /// them): the blocks around the line (`stages[2].model`), then the keys of the flow
    /// mappings that enclose the column on it (`batch.max_size`).
    pub(crate) fn field_at(&self, line: u64, column: Option<u64>) -> String {
        let Some(at) = (line as usize).checked_sub(1) else {
            return String::new();
        };
        let Some(text) = self.lines.get(at) else {
            return String::new();
        };
        let mut path = self.blocks_around(at);
        path.extend(flow_keys(text, column.map(|c| c as usize)));
        path.join(".")
    }

    /// The value written at `line` and `column` (a scalar up to the next `,`, `}` or
    /// comment; a flow sequence whole), if there is one.
    pub(crate) fn value_at(&self, line: u64, column: u64) -> Option<String> {
        let text = self.lines.get((line as usize).checked_sub(1)?)?;
        let rest = text.get((column as usize).checked_sub(1)?..)?;
        let value = if rest.starts_with('[') {
            rest.find(']').and_then(|end| rest.get(..=end))?
        } else {
            rest.split([',', '}', '#']).next()?.trim()
        };
        (!value.is_empty()).then(|| value.to_string())
    }

    /// The keys of the blocks that line `at` (0-based) sits in, outermost first; a list item
    /// is named by its list's key and its position (`stages[2]`).
    fn blocks_around(&self, at: usize) -> Vec<String> {
        let mut keys = Vec::new();
        let mut row = at;
        while let Some(line) = self.lines.get(row) {
            let limit = indent(line);
            if is_item(line) {
                let Some(list) = self.parent_of(row, limit, true) else {
                    break;
                };
                let name = self
                    .lines
                    .get(list)
                    .copied()
                    .map(key_of)
                    .unwrap_or_default();
                keys.push(format!("{name}[{}]", self.position_of(list, row, limit)));
                row = list;
            } else {
                let Some(parent) = self.parent_of(row, limit, false) else {
                    break;
                };
                // `- model:` names a block (then its list names the item); a bare `-` does not.
                let key = self
                    .lines
                    .get(parent)
                    .copied()
                    .map(key_of)
                    .unwrap_or_default();
                // A mapping or list written in flow style over several lines (JSON, as the
                // Python package writes a dict) has no blocks to follow: the line's own keys
                // are all that is known.
                if key.starts_with(['{', '[']) {
                    return Vec::new();
                }
                if !key.is_empty() {
                    keys.push(key);
                }
                row = parent;
            }
        }
        keys.reverse();
        keys
    }

    /// The nearest line above `row` that opens the block holding it: indented less, or (for
    /// a list item) a key at the same indent (`stages:` over `- a`).
    fn parent_of(&self, row: usize, limit: usize, item: bool) -> Option<usize> {
        (0..row).rev().find(|&k| {
            let l = self.lines.get(k).copied().unwrap_or("");
            !blank(l) && (indent(l) < limit || (item && indent(l) == limit && !is_item(l)))
        })
    }

    /// How many items of the list opened at `parent` come before `row`.
    fn position_of(&self, parent: usize, row: usize, limit: usize) -> usize {
        (parent + 1..row)
            .filter(|&k| {
                let l = self.lines.get(k).copied().unwrap_or("");
                indent(l) == limit && is_item(l)
            })
            .count()
    }
}

/// The keys of the flow mappings (`batch: { max_size: 3 }`) open at `column` on `line`,
/// outermost first, ending with the key whose value is there; the whole line without a
/// column.
fn flow_keys(line: &str, column: Option<usize>) -> Vec<String> {
    let end = column.map_or(line.len(), |c| c.saturating_sub(1).min(line.len()));
    let text = line.get(..end).unwrap_or(line);
    let body = text.trim_start();
    let body = if is_item(body) {
        body.strip_prefix('-').unwrap_or(body)
    } else {
        body
    };
    // Keys of the enclosing mappings, and the key most recently written at this depth.
    let mut open: Vec<Option<String>> = Vec::new();
    let mut last: Option<String> = None;
    let mut token = String::new();
    let mut quote: Option<char> = None;
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => token.push(c),
            (None, '"' | '\'') => quote = Some(c),
            (None, '#') => break,
            (None, '{') => {
                open.push(last.take());
                token.clear();
            }
            (None, '}') => {
                last = open.pop().flatten();
                token.clear();
            }
            (None, ',') => {
                last = None;
                token.clear();
            }
            (None, ':') if chars.peek().is_none_or(|n| n.is_whitespace() || *n == '{') => {
                last = Some(token.trim().to_string());
                token.clear();
            }
            (None, c) => token.push(c),
        }
    }
    open.into_iter().flatten().chain(last).collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn field(text: &str, line: u64, column: Option<u64>) -> String {
        let at = Locator {
            file: Path::new("p.yaml"),
            lines: text.lines().collect(),
        };
        at.field_at(line, column)
    }

    #[test]
    fn a_value_in_a_flow_mapping_is_named_by_its_innermost_key_and_its_blocks() {
        let text = "runtime:\n  workers: 2\nstages:\n  - resize: { width: 8 }\n  - model:\n      path: m.onnx\n      # why\n      batch: { max_size: lots, max_delay_ms: 5 }\n";
        let line = text.lines().nth(7).unwrap();
        let value = line.find("lots").unwrap() as u64 + 1;
        assert_eq!(
            field(text, 8, Some(value)),
            "stages[1].model.batch.max_size"
        );
        let delay = line.find("5 }").unwrap() as u64 + 1;
        assert_eq!(
            field(text, 8, Some(delay)),
            "stages[1].model.batch.max_delay_ms"
        );
        assert_eq!(field(text, 2, None), "runtime.workers");
        assert_eq!(field(text, 4, Some(21)), "stages[0].resize.width");
    }

    #[test]
    fn json_over_several_lines_gives_the_line_s_own_key() {
        let text =
            "{\n \"stages\": [\n  {\n   \"filter\": {\n    \"op\": \"bigger\"\n   }\n  }\n ]\n}";
        assert_eq!(field(text, 5, Some(11)), "op");
    }

    #[test]
    fn lists_at_their_keys_indent_and_nested_mappings_are_followed() {
        let text = "stages:\n- resize: {width: 8}\n- detections:\n    labels: { 1: person, \"2\": {x: car} }\n";
        let line = text.lines().nth(3).unwrap();
        let car = line.find("car").unwrap() as u64 + 1;
        assert_eq!(field(text, 4, Some(car)), "stages[1].detections.labels.2.x");
        let person = line.find("person").unwrap() as u64 + 1;
        assert_eq!(
            field(text, 4, Some(person)),
            "stages[1].detections.labels.1"
        );
    }
}
