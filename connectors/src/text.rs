//! What the CSV and JSON-lines sources share: splitting a text file into records and dealing
//! chunks of records to workers. Records are decoded by [`crate::formats`], which turns
//! undecodable ones into dead letters.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use riffle_dataflow::dead_letter::DeadLetter;
use riffle_dataflow::range::Range;
use riffle_dataflow::source::SourceBatch;
use riffle_dataflow::{DataflowError, DataflowResult, Source};

use crate::formats::Decoder;

/// One record of a text file: its bytes (ending in `\n`) and the 1-based line it starts on.
#[derive(Clone, Debug)]
pub(crate) struct Record {
    pub line: u64,
    pub bytes: Vec<u8>,
    /// The record was longer than the reader's limit: `bytes` is empty, the rest was skipped.
    pub oversized: bool,
}

/// Default `max_line_bytes` of the text sources: 1 MiB.
pub const DEFAULT_MAX_LINE_BYTES: usize = 1 << 20;

/// Where CSV quoting stands while scanning a record; mirrors the CSV parser so that a
/// quoted field with a newline in it stays one record.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CsvState {
    FieldStart,
    Unquoted,
    Quoted,
    /// A quote inside a quoted field: either the field's end or the first of `""`.
    QuoteInQuoted,
}

/// How a file is cut into records.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Framing {
    /// One record per line (JSON lines).
    Lines,
    /// CSV records, which may span lines inside quoted fields.
    Csv { delimiter: u8, quote: u8 },
}

/// Reads a text file record by record, skipping blank lines.
pub(crate) struct RecordReader {
    reader: BufReader<File>,
    path: PathBuf,
    framing: Framing,
    /// Longest record kept, line ends included; longer ones are skipped and flagged.
    max_bytes: usize,
    /// Lines consumed so far.
    line: u64,
    /// Reused buffer for skipped records.
    scratch: Vec<u8>,
}

impl RecordReader {
    /// Opens a regular file (a FIFO or device is refused by name: it could block or never
    /// end); records longer than `max_bytes` are skipped and flagged.
    pub fn open(path: &Path, framing: Framing, max_bytes: usize) -> DataflowResult<Self> {
        let (file, _) = crate::files::open_regular(path)?;
        Ok(RecordReader {
            reader: BufReader::with_capacity(256 * 1024, file),
            path: path.to_path_buf(),
            framing,
            max_bytes,
            line: 0,
            scratch: Vec::new(),
        })
    }

    /// Appends one line to `buf` while `buf` stays within `max_bytes`; past that, the rest of
    /// the line is read and dropped. Returns the bytes consumed and whether any were dropped.
    #[allow(
        clippy::indexing_slicing,
        reason = "`take` is at most `available.len()`: a newline's index + 1, or the length"
    )]
    fn read_line(&mut self, buf: &mut Vec<u8>) -> DataflowResult<(usize, bool)> {
        let io = |e| DataflowError::io(format!("reading {}", self.path.display()), e);
        let (mut consumed, mut dropped) = (0, false);
        loop {
            let available = match self.reader.fill_buf() {
                Ok(available) => available,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io(e)),
            };
            if available.is_empty() {
                break;
            }
            let newline = available.iter().position(|&b| b == b'\n');
            let take = newline.map_or(available.len(), |i| i + 1);
            if !dropped && buf.len() + take <= self.max_bytes {
                buf.extend_from_slice(&available[..take]);
            } else {
                dropped = true;
            }
            self.reader.consume(take);
            consumed += take;
            if newline.is_some() {
                break;
            }
        }
        if consumed > 0 {
            self.line += 1;
        }
        Ok((consumed, dropped))
    }

    /// Reads the next non-blank record into `bytes` (cleared first) and returns the line it
    /// starts on and whether it was over the limit (then `bytes` is empty), or `None` at the
    /// end of the file.
    #[allow(
        clippy::indexing_slicing,
        reason = "`scanned` only advances over bytes of `bytes` already scanned"
    )]
    fn read_record(&mut self, bytes: &mut Vec<u8>) -> DataflowResult<Option<(u64, bool)>> {
        loop {
            bytes.clear();
            let (n, mut dropped) = self.read_line(bytes)?;
            if n == 0 {
                return Ok(None);
            }
            let line = self.line;
            if let Framing::Csv { delimiter, quote } = self.framing {
                let mut state = CsvState::FieldStart;
                let mut scanned = 0;
                // Once over the limit the quoting is no longer followed: the record ends with
                // the line where it passed the limit.
                while !dropped {
                    state = scan_csv(&bytes[scanned..], state, delimiter, quote);
                    // An open quote at the end of a line continues the record; at the end of
                    // the file the parser rejects it.
                    if state != CsvState::Quoted {
                        break;
                    }
                    scanned = bytes.len();
                    let (n, over) = self.read_line(bytes)?;
                    dropped = over;
                    if n == 0 {
                        break;
                    }
                }
            }
            if dropped {
                bytes.clear();
                return Ok(Some((line, true)));
            }
            if bytes.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            if bytes.last() != Some(&b'\n') {
                bytes.push(b'\n');
            }
            return Ok(Some((line, false)));
        }
    }

    /// The next non-blank record, or `None` at the end of the file.
    pub fn next_record(&mut self) -> DataflowResult<Option<Record>> {
        let mut bytes = Vec::new();
        Ok(self
            .read_record(&mut bytes)?
            .map(|(line, oversized)| Record {
                line,
                bytes,
                oversized,
            }))
    }

    /// Sample records for schema inference: up to `records` of them, stopping once `bytes`
    /// are read; records over the limit are left out.
    pub fn sample(&mut self, records: usize, bytes: usize) -> DataflowResult<Vec<Record>> {
        let mut sample = Vec::new();
        let mut read = 0;
        while sample.len() < records && read < bytes {
            match self.next_record()? {
                Some(r) if r.oversized => read += self.max_bytes,
                Some(r) => {
                    read += r.bytes.len();
                    sample.push(r);
                }
                None => break,
            }
        }
        Ok(sample)
    }

    /// Passes over up to `n` records without keeping them (other workers' chunks); returns how
    /// many there were.
    pub fn skip_records(&mut self, n: usize) -> DataflowResult<usize> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut skipped = 0;
        while skipped < n && self.read_record(&mut scratch)?.is_some() {
            skipped += 1;
        }
        self.scratch = scratch;
        Ok(skipped)
    }

    /// Up to `n` records; fewer only at the end of the file.
    pub fn next_chunk(&mut self, n: usize) -> DataflowResult<Vec<Record>> {
        let mut records = Vec::with_capacity(n.min(4096));
        while records.len() < n {
            match self.next_record()? {
                Some(r) => records.push(r),
                None => break,
            }
        }
        Ok(records)
    }
}

/// Advances the CSV quoting state over `bytes`; a newline outside quotes resets it.
fn scan_csv(bytes: &[u8], mut state: CsvState, delimiter: u8, quote: u8) -> CsvState {
    for &b in bytes {
        state = match (state, b) {
            (CsvState::Quoted, b) if b == quote => CsvState::QuoteInQuoted,
            (CsvState::Quoted, _) => CsvState::Quoted,
            (CsvState::QuoteInQuoted, b) if b == quote => CsvState::Quoted,
            (_, b'\n') => CsvState::FieldStart,
            (_, b) if b == delimiter => CsvState::FieldStart,
            (CsvState::FieldStart, b) if b == quote => CsvState::Quoted,
            _ => CsvState::Unquoted,
        };
    }
    state
}

/// The chunks of a text file that one worker reads: chunk `c` (of `batch_size` records)
/// belongs to worker `c % peers`.
pub(crate) struct TextPartition {
    reader: RecordReader,
    decoder: Decoder,
    path: PathBuf,
    batch_size: usize,
    index: usize,
    peers: usize,
    next_chunk: usize,
}

impl TextPartition {
    pub fn new(
        path: &Path,
        framing: Framing,
        max_line_bytes: usize,
        decoder: Decoder,
        batch_size: usize,
        index: usize,
        peers: usize,
    ) -> DataflowResult<Self> {
        crate::check_partition(index, peers)?;
        Ok(TextPartition {
            reader: RecordReader::open(path, framing, max_line_bytes)?,
            decoder,
            path: path.to_path_buf(),
            batch_size,
            index,
            peers,
            next_chunk: 0,
        })
    }

    /// Skips records that precede the data (a CSV header).
    pub fn skip_records(&mut self, n: usize) -> DataflowResult<()> {
        self.reader.skip_records(n).map(|_| ())
    }

    /// Decodes a chunk, rejecting only its bad records.
    #[allow(
        clippy::indexing_slicing,
        reason = "the indices come from `decode_or_reject` over `fits` itself"
    )]
    fn decode_chunk(&self, records: &[Record]) -> DataflowResult<SourceBatch> {
        let letter = |line: u64, reason: String| DeadLetter {
            stage: "source".to_string(),
            reason,
            record: serde_json::json!({
                "path": self.path.to_string_lossy(),
                "line": line,
            })
            .to_string(),
        };
        let mut rejected = Vec::new();
        let mut fits = Vec::with_capacity(records.len());
        for r in records {
            if r.oversized {
                rejected.push(letter(
                    r.line,
                    format!(
                        "line {}: record longer than max_line_bytes ({})",
                        r.line, self.reader.max_bytes
                    ),
                ));
            } else {
                fits.push(r);
            }
        }
        let payloads: Vec<&[u8]> = fits.iter().map(|r| r.bytes.as_slice()).collect();
        let decoded = self.decoder.decode_or_reject(&payloads, |i, e| {
            let line = fits[i].line;
            letter(line, self.decoder.reason(e, Some(line)))
        })?;
        rejected.extend(decoded.rejected);
        Ok(SourceBatch::new(decoded.batch, rejected))
    }
}

impl Source for TextPartition {
    fn next_batch(&mut self) -> DataflowResult<Option<SourceBatch>> {
        // Other workers' chunks are scanned (to count records) but not kept or decoded.
        while self.next_chunk % self.peers != self.index {
            if self.reader.skip_records(self.batch_size)? == 0 {
                return Ok(None);
            }
            self.next_chunk += 1;
        }
        let records = self.reader.next_chunk(self.batch_size)?;
        if records.is_empty() {
            return Ok(None);
        }
        self.next_chunk += 1;
        self.decode_chunk(&records).map(Some)
    }
}

/// Config checks shared by the text sources.
pub(crate) fn check_config(
    kind: &str,
    batch_size: usize,
    max_line_bytes: usize,
) -> DataflowResult<()> {
    if batch_size == 0 {
        return Err(DataflowError::Config(format!(
            "{kind} source: batch_size must be at least 1"
        )));
    }
    MAX_LINE_BYTES
        .check_int(max_line_bytes as u64)
        .map_err(|e| DataflowError::Config(format!("{kind} source: {e}")).at("max_line_bytes"))
}

/// A record is one row of a batch's columns, which hold at most 2 GiB: 256 MiB at most.
pub(crate) const MAX_LINE_BYTES: Range = Range::int("max_line_bytes", 1, 256 << 20);

/// The ranges of the text sources' numbers.
pub(crate) const TEXT_RANGES: &[Range] = &[crate::kind::shared::BATCH_SIZE, MAX_LINE_BYTES];

/// Bytes sampled at most to infer a text file's schema.
pub(crate) const INFER_BYTES: usize = 16 << 20;

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn records(text: &str, framing: Framing) -> Vec<(u64, String)> {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(text.as_bytes()).unwrap();
        let mut reader = RecordReader::open(file.path(), framing, 64).unwrap();
        reader
            .next_chunk(usize::MAX)
            .unwrap()
            .into_iter()
            .map(|r| {
                let text = String::from_utf8(r.bytes).unwrap();
                (r.line, if r.oversized { "<over>".into() } else { text })
            })
            .collect()
    }

    #[test]
    fn csv_records_span_quoted_newlines_and_skip_blank_lines() {
        let csv = Framing::Csv {
            delimiter: b',',
            quote: b'"',
        };
        let got = records("a,b\n\n1,\"x\ny\"\n2,5\" screen\n3,\"q\"\"\n\"\n4,z", csv);
        assert_eq!(
            got,
            vec![
                (1, "a,b\n".to_string()),
                (3, "1,\"x\ny\"\n".to_string()),
                (5, "2,5\" screen\n".to_string()),
                (6, "3,\"q\"\"\n\"\n".to_string()),
                (8, "4,z\n".to_string()),
            ]
        );
    }

    #[test]
    fn records_over_the_limit_are_flagged_and_skipped_to_their_end() {
        let long = "x".repeat(100);
        let got = records(&format!("a\n{long}\nb\n{long}"), Framing::Lines);
        assert_eq!(
            got,
            vec![
                (1, "a\n".to_string()),
                (2, "<over>".to_string()),
                (3, "b\n".to_string()),
                (4, "<over>".to_string()),
            ]
        );
        // A quoted CSV field spanning lines counts whole.
        let csv = Framing::Csv {
            delimiter: b',',
            quote: b'"',
        };
        let text = format!("1,\"{}\n{}\"\n2,y\n", &long[..40], &long[..40]);
        let got = records(&text, csv);
        assert_eq!(got[0], (1, "<over>".to_string()));
        assert_eq!(got.last(), Some(&(3, "2,y\n".to_string())));
    }

    #[test]
    fn json_lines_are_one_record_each() {
        let got = records("{\"a\":\"x\ny\"}\n  \n{}", Framing::Lines);
        assert_eq!(
            got,
            vec![
                (1, "{\"a\":\"x\n".to_string()),
                (2, "y\"}\n".to_string()),
                (4, "{}\n".to_string()),
            ]
        );
    }
}
