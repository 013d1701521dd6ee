//! The HTTP sink's factory and writer: rows are held as JSON lines and sent in requests of at
//! most `max_rows_per_request` as they fill and at each flush (an epoch completing); the rows
//! of refused requests are appended to the dead-letter file.

use std::collections::BTreeMap;

use arrow_array::RecordBatch;
use riffle_dataflow::sink::{Sink, SinkFactory};
use riffle_dataflow::{DataflowResult, Epoch};

use super::client::{quote, Answer, Client, Tally};
use super::config::{BodyFormat, HttpSinkConfig};

/// A configured HTTP sink; each `open` builds its client and opens the dead-letter file.
#[derive(Debug)]
pub struct HttpSinkFactory {
    config: HttpSinkConfig,
}

impl HttpSinkFactory {
    /// Checks the configuration (the CA file included); connects only when sending.
    pub fn new(config: &HttpSinkConfig) -> DataflowResult<Self> {
        config.check()?;
        Client::new(config)?;
        Ok(HttpSinkFactory {
            config: config.clone(),
        })
    }
}

impl SinkFactory for HttpSinkFactory {
    fn open(&self) -> DataflowResult<Box<dyn Sink>> {
        Ok(Box::new(HttpSink::new(&self.config)?))
    }
}

/// An open HTTP sink.
pub struct HttpSink {
    config: HttpSinkConfig,
    client: Client,
    /// Rows not yet sent, one JSON object each (no line end).
    pending: Vec<Vec<u8>>,
    /// What the Idempotency-Key starts with: the pipeline's name once epochs are known (runs
    /// with checkpoints, whose replays must repeat their keys), else the name and the run's
    /// start, so that runs from scratch never share keys.
    prefix: String,
    epoch: Epoch,
    /// Requests sent in this epoch (in the whole run without checkpoints).
    sent_in_epoch: u64,
    dead_letters: crate::lines::AppendLines,
    /// Rows refused, per status, for one warning each and the total at the end.
    refused: BTreeMap<u16, u64>,
    tally: Tally,
}

fn run_start_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// The sink runs on worker 0 (the runtime opens one writer); part of the key all the same,
/// so that keys stay unique if sinks are ever opened per worker.
const WORKER: u32 = 0;

impl HttpSink {
    fn new(config: &HttpSinkConfig) -> DataflowResult<HttpSink> {
        Ok(HttpSink {
            config: config.clone(),
            client: Client::new(config)?,
            pending: Vec::new(),
            prefix: format!("{}@{}", config.pipeline, run_start_ms()),
            epoch: 0,
            sent_in_epoch: 0,
            dead_letters: crate::lines::AppendLines::new(config.dead_letter_path.clone()),
            refused: BTreeMap::new(),
            tally: Tally::default(),
        })
    }

    /// `<prefix>-<epoch>-<worker>-<n>`: the same for a request's retries, and for an epoch
    /// replayed after a restart (its rows come again in the same batches).
    fn next_key(&mut self) -> String {
        let key = format!(
            "{}-{}-{WORKER}-{}",
            self.prefix, self.epoch, self.sent_in_epoch
        );
        self.sent_in_epoch += 1;
        key
    }

    fn body(&self, rows: &[Vec<u8>]) -> Vec<u8> {
        let size = rows.iter().map(|r| r.len() + 1).sum::<usize>() + 2;
        let mut body = Vec::with_capacity(size);
        match self.config.format {
            BodyFormat::JsonArray => {
                body.push(b'[');
                for (i, row) in rows.iter().enumerate() {
                    if i > 0 {
                        body.push(b',');
                    }
                    body.extend_from_slice(row);
                }
                body.push(b']');
            }
            BodyFormat::Ndjson => {
                for row in rows {
                    body.extend_from_slice(row);
                    body.push(b'\n');
                }
            }
        }
        body
    }

    /// Sends the pending rows in requests of at most `max_rows_per_request`; `all` sends a
    /// last, short one too.
    fn send_pending(&mut self, all: bool) -> DataflowResult<()> {
        let per = usize::try_from(self.config.max_rows_per_request.max(1)).unwrap_or(usize::MAX);
        while self.pending.len() >= per || (all && !self.pending.is_empty()) {
            let rows: Vec<Vec<u8>> = self.pending.drain(..per.min(self.pending.len())).collect();
            let key = self.next_key();
            let body = self.body(&rows);
            if let Answer::Refused { status, body } =
                self.client.send(&body, &key, &mut self.tally)?
            {
                self.refuse(status, &body, &rows)?;
            }
        }
        Ok(())
    }

    fn refuse(&mut self, status: u16, body: &str, rows: &[Vec<u8>]) -> DataflowResult<()> {
        let reason = format!(
            "HTTP {status} from {}: {}",
            self.config.label(),
            quote(body)
        );
        let count = self.refused.entry(status).or_insert(0);
        if *count == 0 {
            tracing::warn!(
                url = %self.config.label(),
                dead_letters = %self.config.dead_letter_path.display(),
                "http sink: HTTP {status} refused a request; its rows go to the dead-letter file \
                 (the count per status is logged at the end)"
            );
        }
        *count += rows.len() as u64;
        for row in rows {
            let row: serde_json::Value = serde_json::from_slice(row)
                .map_err(|e| self.config.sink_error(format!("re-reading a row: {e}")))?;
            self.dead_letters
                .write(&serde_json::json!({ "reason": reason, "row": row }))?;
        }
        self.dead_letters.flush()
    }
}

impl Sink for HttpSink {
    fn write_batch(&mut self, batch: &RecordBatch) -> DataflowResult<()> {
        let lines = crate::lines::json_lines(batch)
            .map_err(|e| self.config.sink_error(format!("encoding JSON: {e}")))?;
        self.pending.extend(
            lines
                .split(|&b| b == b'\n')
                .filter(|l| !l.is_empty())
                .map(<[u8]>::to_vec),
        );
        self.send_pending(false)
    }

    fn flush(&mut self) -> DataflowResult<()> {
        self.send_pending(true)
    }

    /// Called only in runs with checkpoints; the generation is new at each restart, so it is
    /// left out of the key.
    fn begin_epoch(&mut self, _generation: u64, epoch: Epoch) {
        self.prefix.clone_from(&self.config.pipeline);
        self.epoch = epoch;
        self.sent_in_epoch = 0;
    }

    fn finish(&mut self) -> DataflowResult<()> {
        self.flush()?;
        for (status, rows) in &self.refused {
            tracing::warn!(
                url = %self.config.label(),
                "http sink: {rows} row(s) refused with HTTP {status}, in {}",
                self.config.dead_letter_path.display()
            );
        }
        tracing::info!(
            url = %self.config.label(),
            "http sink: {} request attempt(s), {} retried, {} refused",
            self.tally.requests,
            self.tally.retries,
            self.tally.refusals
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_repeat_for_a_replayed_epoch_and_differ_between_fresh_runs() {
        let mut config: HttpSinkConfig =
            serde_json::from_value(serde_json::json!({"url": "http://h/x"})).unwrap();
        config.pipeline = "clicks".into();
        let mut a = HttpSink::new(&config).unwrap();
        let fresh = a.next_key();
        assert!(
            fresh.starts_with("clicks@") && fresh.ends_with("-0-0-0"),
            "{fresh}"
        );
        a.begin_epoch(1_000, 7);
        assert_eq!(
            [a.next_key(), a.next_key()],
            ["clicks-7-0-0", "clicks-7-0-1"]
        );
        // A restart: another generation, the same epoch replayed.
        let mut b = HttpSink::new(&config).unwrap();
        b.begin_epoch(2_000, 7);
        assert_eq!(b.next_key(), "clicks-7-0-0");
        std::thread::sleep(std::time::Duration::from_millis(2));
        let mut c = HttpSink::new(&config).unwrap();
        assert_ne!(c.next_key(), fresh);
    }
}
