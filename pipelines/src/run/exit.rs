//! The exit-code policy of a run: 0 when it ended well, [`FAILED`] on an error, and
//! [`DEAD_LETTERS`] when it ended with more of its records in dead letters than
//! `runtime.max_dead_letter_ratio` allows, which a supervisor does not restart (bad input, not
//! a crash: running again would end the same way).

use riffle_dataflow::observe::summary::Summary;
use thiserror::Error;

/// The run ended well (or stopped on request).
pub const OK: i32 = 0;
/// The run failed: a [`super::RunError`].
pub const FAILED: i32 = 1;
/// The run ended with too many dead letters: [`TooManyDeadLetters`].
pub const DEAD_LETTERS: i32 = 3;

/// A run that ended with more of its records in dead letters than
/// `runtime.max_dead_letter_ratio` allows (by default: all of them).
#[derive(Clone, Debug, Error)]
#[error("{0}")]
pub struct TooManyDeadLetters(String);

impl TooManyDeadLetters {
    /// What `riffle run` exits with (1 is any other failure).
    pub const EXIT_CODE: i32 = DEAD_LETTERS;

    /// The verdict on a process's summary: `None` when its dead letters are within `ratio`
    /// (`None`: any share but all of the records read).
    pub fn check(summary: &Summary, ratio: Option<f64>) -> Option<Self> {
        let (dead, read) = summary.dead_letter_share();
        let too_many = match ratio {
            Some(r) => read > 0 && dead as f64 > r * read as f64,
            None => read > 0 && dead >= read,
        };
        if !too_many {
            return None;
        }
        let limit = match ratio {
            Some(r) => format!("more than runtime.max_dead_letter_ratio ({r})"),
            None => "all of them (runtime.max_dead_letter_ratio sets how many may)".to_string(),
        };
        let reasons: Vec<String> = summary
            .dead_letter_reasons
            .iter()
            .take(3)
            .map(|(reason, n)| format!("{n} × {reason}"))
            .collect();
        let reasons = if reasons.is_empty() {
            "the reasons are in the dead-letter sink".to_string()
        } else {
            format!("commonest reasons: {}", reasons.join("; "))
        };
        Some(TooManyDeadLetters(format!(
            "{dead} of the {read} records read went to dead letters, {limit}; {reasons}"
        )))
    }

    /// A supervisor's verdict: process `process` of its cluster exited with [`DEAD_LETTERS`]
    /// (and said why on its stderr).
    pub(crate) fn in_process(process: usize) -> Self {
        TooManyDeadLetters(format!(
            "process {process} ended with too many of its records in dead letters (its error above says which)"
        ))
    }

    /// The same verdict, reached while the cluster was stopping on request.
    pub(crate) fn while_stopping(self) -> Self {
        TooManyDeadLetters(format!("while stopping: {}", self.0))
    }
}
