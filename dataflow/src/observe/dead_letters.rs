//! Dead letters counted by stage and reason, for the end-of-run report.

use std::collections::BTreeMap;
use std::sync::Mutex;

use arrow_array::cast::AsArray;
use arrow_array::RecordBatch;

use super::lock;

/// Distinct dead-letter reasons counted; later ones are counted together.
const MAX_REASONS: usize = 64;
/// Longest reason kept for counting (reasons quoting a record differ past this).
const REASON_CHARS: usize = 160;
const OTHER_REASONS: &str = "(other reasons)";

/// The dead letters a process wrote, by `stage: reason` (bounded: past `MAX_REASONS`
/// distinct ones, new reasons count as one).
#[derive(Default)]
pub struct DeadLetterReasons {
    counts: Mutex<BTreeMap<String, u64>>,
}

impl DeadLetterReasons {
    /// Counts the reasons of a batch of dead letters (in [`crate::dead_letter::schema`]).
    pub fn record(&self, batch: &RecordBatch) {
        let column = |name| {
            batch
                .column_by_name(name)
                .and_then(|c| c.as_string_opt::<i32>())
        };
        let (Some(stages), Some(reasons)) = (column("stage"), column("reason")) else {
            return;
        };
        let mut counts = lock(&self.counts);
        for (stage, reason) in stages.iter().zip(reasons.iter()) {
            let reason: String = reason.unwrap_or("").chars().take(REASON_CHARS).collect();
            let key = format!("{}: {reason}", stage.unwrap_or("?"));
            let key = if counts.contains_key(&key) || counts.len() < MAX_REASONS {
                key
            } else {
                OTHER_REASONS.to_string()
            };
            *counts.entry(key).or_insert(0) += 1;
        }
    }

    /// Every `stage: reason` with its count, commonest first (ties by name).
    pub fn commonest(&self) -> Vec<(String, u64)> {
        let mut reasons: Vec<(String, u64)> = lock(&self.counts)
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        reasons.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        reasons
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{ArrayRef, StringArray};
    use std::sync::Arc;

    fn letters(rows: &[(&str, &str)]) -> RecordBatch {
        let stages: Vec<&str> = rows.iter().map(|r| r.0).collect();
        let reasons: Vec<&str> = rows.iter().map(|r| r.1).collect();
        RecordBatch::try_from_iter([
            ("stage", Arc::new(StringArray::from(stages)) as ArrayRef),
            ("reason", Arc::new(StringArray::from(reasons)) as ArrayRef),
        ])
        .unwrap()
    }

    #[test]
    fn counts_by_stage_and_reason_commonest_first() {
        let reasons = DeadLetterReasons::default();
        reasons.record(&letters(&[
            ("decode", "bad"),
            ("model", "nan"),
            ("decode", "bad"),
        ]));
        assert_eq!(
            reasons.commonest(),
            vec![
                ("decode: bad".to_string(), 2),
                ("model: nan".to_string(), 1)
            ]
        );
    }

    #[test]
    fn bounds_the_distinct_reasons() {
        let reasons = DeadLetterReasons::default();
        let many: Vec<String> = (0..MAX_REASONS + 5).map(|i| format!("r{i}")).collect();
        let rows: Vec<(&str, &str)> = many.iter().map(|r| ("s", r.as_str())).collect();
        reasons.record(&letters(&rows));
        let counted = reasons.commonest();
        assert_eq!(counted.len(), MAX_REASONS + 1);
        assert_eq!(counted[0], (OTHER_REASONS.to_string(), 5));
    }
}
