//! Stdout sink: results as JSON lines on standard output.

use std::io::{self, Write};

use riffle_dataflow::sink::{Sink, SinkFactory};
use riffle_dataflow::DataflowResult;
use serde::Deserialize;

use crate::lines::JsonLinesSink;

use crate::kind::Limits;
use crate::kind::SinkKind;

/// Bytes gathered before whole lines are written out.
const BUFFER_BYTES: usize = 64 * 1024;

/// `sink: { stdout: {} }`: the same JSON lines as the `jsonl` sink, on standard output.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StdoutSinkConfig {}

pub type StdoutSink = JsonLinesSink<LockedStdout>;

impl SinkFactory for StdoutSinkConfig {
    fn open(&self) -> DataflowResult<Box<dyn Sink>> {
        let sink: StdoutSink = JsonLinesSink::new(LockedStdout::default(), "stdout");
        Ok(Box::new(sink))
    }
}

/// Buffered standard output that only ever writes whole lines, each time under stdout's lock,
/// so rows are never interleaved mid-line with other output (log lines, other sinks).
#[derive(Default)]
pub struct LockedStdout {
    buf: Vec<u8>,
}

impl LockedStdout {
    #[allow(
        clippy::indexing_slicing,
        reason = "`end` is the length of complete lines in `buf`, found in `buf`"
    )]
    fn write_out(&mut self, end: usize) -> io::Result<()> {
        let mut out = io::stdout().lock();
        out.write_all(&self.buf[..end])?;
        self.buf.drain(..end);
        Ok(())
    }
}

impl Write for LockedStdout {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= BUFFER_BYTES {
            if let Some(last_newline) = self.buf.iter().rposition(|&b| b == b'\n') {
                self.write_out(last_newline + 1)?;
            }
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.write_out(self.buf.len())?;
        io::stdout().lock().flush()
    }
}

impl Drop for LockedStdout {
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            tracing::warn!("stdout sink: {e}");
        }
    }
}

impl SinkKind for StdoutSinkConfig {
    fn kind(&self) -> &'static str {
        "stdout"
    }
    fn build(&self) -> DataflowResult<Box<dyn SinkFactory>> {
        Ok(Box::new(self.clone()))
    }
}

impl Limits for StdoutSinkConfig {}
