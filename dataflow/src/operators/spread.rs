use std::ops::Range;

use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Operator;

use super::BatchStream;
use crate::{Batch, BatchKind};

/// Shares every batch's rows out among all workers.
pub trait Spread<'scope> {
    /// Cuts every batch into one slice per worker, of about equal rows, and sends each slice to
    /// another worker, so that every worker gets its share of every batch, however skewed the
    /// keys before were (a user who clicks fifty times in an epoch lands on one worker; the
    /// fifty clicks' candidates are then scored on all of them). With `together`, the runs of
    /// equal adjacent values in that column (the candidates of one click) are never cut.
    /// Dead letters stay where they are. Order across slices is not kept.
    ///
    /// # Examples
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use arrow_array::{Int64Array, RecordBatch};
    /// use riffle_dataflow::Batch;
    /// use riffle_dataflow::operators::Spread;
    /// use timely::dataflow::operators::{Inspect, ToStream};
    ///
    /// let slices = Arc::new(Mutex::new(Vec::new()));
    /// let seen = slices.clone();
    /// timely::example(move |scope| {
    ///     let events = Int64Array::from(vec![1, 1, 1, 2, 3, 3]);
    ///     let batch = RecordBatch::try_from_iter(vec![("event", Arc::new(events) as _)]).unwrap();
    ///     vec![Batch::records(batch, 0)]
    ///         .to_stream(scope)
    ///         .container::<Vec<_>>()
    ///         .spread(Some("event"))
    ///         .inspect(move |b: &Batch| seen.lock().unwrap().push(b.num_rows()));
    /// });
    /// // One worker here: the batch is one slice. With two, it would be cut 3 | 3.
    /// assert_eq!(*slices.lock().unwrap(), vec![6]);
    /// ```
    fn spread(self, together: Option<&str>) -> Self;
}

impl<'scope> Spread<'scope> for BatchStream<'scope> {
    fn spread(self, together: Option<&str>) -> Self {
        let peers = self.scope().peers();
        let index = self.scope().index();
        let together = together.map(str::to_string);
        // Slices of small batches (fewer runs than workers) start at a worker that moves on, so
        // they do not all land on the first ones.
        let mut next = index;
        let cut = self.unary(Pipeline, "CutPerWorker", move |_, _| {
            move |input, output| {
                input.for_each(|cap, data| {
                    let mut session = output.session(&cap);
                    for mut batch in data.drain(..) {
                        if batch.kind != BatchKind::Records || peers < 2 || batch.num_rows() < 2 {
                            batch.route = index as u64;
                            session.give(batch);
                            continue;
                        }
                        let cuts = slices(&batch, together.as_deref(), peers);
                        let first = next;
                        next = (next + 1) % peers;
                        for (n, rows) in cuts.into_iter().enumerate() {
                            let mut slice =
                                batch.with_data(batch.data.slice(rows.start, rows.len()));
                            slice.route = ((first + n) % peers) as u64;
                            session.give(slice);
                        }
                    }
                });
            }
        });
        super::to_routes(cut, "Spread")
    }
}

/// Up to `parts` contiguous ranges of about equal rows covering `batch`, each ending where a run
/// of `together` ends (a missing column, or one that cannot be compared, cuts anywhere).
fn slices(batch: &Batch, together: Option<&str>, parts: usize) -> Vec<Range<usize>> {
    let rows = batch.num_rows();
    let runs = together
        .and_then(|c| batch.data.column_by_name(c))
        .and_then(|column| {
            arrow_ord::partition::partition(std::slice::from_ref(column))
                .inspect_err(|e| {
                    tracing::warn!("spread: cannot compare rows of `{together:?}`: {e}")
                })
                .ok()
        });
    let Some(runs) = runs else {
        // Every row is a run of its own: equal cuts.
        return (0..parts)
            .map(|part| rows * part / parts..rows * (part + 1) / parts)
            .filter(|r| !r.is_empty())
            .collect();
    };
    let ends: Vec<usize> = runs.ranges().into_iter().map(|r| r.end).collect();
    let mut out = Vec::with_capacity(parts);
    let mut start = 0;
    let mut runs = ends.iter().copied().peekable();
    for part in 1..=parts {
        let target = rows * part / parts;
        let mut end: usize = start;
        // The run end nearest the target, at least one run per slice.
        while let Some(&e) = runs.peek() {
            if end > start && e.abs_diff(target) > end.abs_diff(target) {
                break;
            }
            end = e;
            runs.next();
        }
        if part == parts {
            end = rows;
        }
        if end > start {
            out.push(start..end);
            start = end;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int64Array, RecordBatch};
    use std::sync::Arc;

    fn events(values: Vec<i64>) -> Batch {
        let column = Arc::new(Int64Array::from(values));
        Batch::records(
            RecordBatch::try_from_iter(vec![("event", column as _)]).unwrap(),
            0,
        )
    }

    #[test]
    fn slices_are_about_equal_and_never_cut_a_run() {
        let batch = events(vec![1, 1, 1, 1, 2, 3, 3, 4, 4, 4]);
        assert_eq!(slices(&batch, Some("event"), 2), vec![0..5, 5..10]);
        assert_eq!(slices(&batch, Some("event"), 3), vec![0..4, 4..7, 7..10]);
        // Without a column, rows are cut anywhere.
        assert_eq!(slices(&batch, None, 2), vec![0..5, 5..10]);
        // Fewer runs than parts: one slice per run.
        assert_eq!(slices(&events(vec![5, 5, 5]), Some("event"), 4), vec![0..3]);
        assert_eq!(
            slices(&events(vec![5, 6]), Some("event"), 4),
            vec![0..1, 1..2]
        );
    }

    #[test]
    fn every_row_is_in_exactly_one_slice() {
        for parts in 1..6 {
            let values: Vec<i64> = (0..37).map(|i| i / 3).collect();
            let batch = events(values);
            let cuts = slices(&batch, Some("event"), parts);
            assert!(cuts.len() <= parts);
            assert_eq!(cuts.first().map(|r| r.start), Some(0));
            assert_eq!(cuts.last().map(|r| r.end), Some(37));
            for pair in cuts.windows(2) {
                assert_eq!(pair[0].end, pair[1].start);
                assert!(pair[0].end % 3 == 0, "cut inside a run at {}", pair[0].end);
            }
        }
    }
}
