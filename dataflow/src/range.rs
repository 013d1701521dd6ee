//! The allowed range of a configuration number, declared once beside the key it bounds and
//! used twice: by validation, on the pipeline file before anything reads it, and by the code
//! that builds from the value (a program that builds a source without a file gets the same
//! bound and the same message).
//!
//! ```
//! use riffle_dataflow::range::Range;
//!
//! const BATCH_SIZE: Range = Range::int("batch_size", 1, 65_536);
//! assert!(BATCH_SIZE.check_int(256).is_ok());
//! let e = BATCH_SIZE.check_int(0).unwrap_err();
//! assert_eq!(e.located().0, Some("batch_size"));
//! assert_eq!(e.to_string(), "batch_size: expected an integer from 1 to 65536, found 0");
//! ```

use crate::error::{DataflowError, DataflowResult};

/// An allowed range, for the numbers of one key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Range {
    /// The key path's end: `workers`, or `batch.max_size` for the key inside `batch`.
    pub key: &'static str,
    pub min: f64,
    pub max: f64,
    /// Whether the values are whole numbers.
    pub integer: bool,
}

impl Range {
    /// Whole numbers from `min` to `max`.
    pub const fn int(key: &'static str, min: i64, max: i64) -> Range {
        Range {
            key,
            min: min as f64,
            max: max as f64,
            integer: true,
        }
    }

    /// Any finite number from `min` to `max`.
    pub const fn real(key: &'static str, min: f64, max: f64) -> Range {
        Range {
            key,
            min,
            max,
            integer: false,
        }
    }

    /// Whether this range applies to a number at `path` (its keys from the block's top):
    /// the path ends in this range's key.
    #[allow(
        clippy::indexing_slicing,
        reason = "the slice starts `keys.len()` from the end of a path at least that long"
    )]
    pub fn applies_to(&self, path: &[&str]) -> bool {
        let keys: Vec<&str> = self.key.split('.').collect();
        path.len() >= keys.len() && path[path.len() - keys.len()..] == keys[..]
    }

    /// `shown` (the number as written) against the range: the message says what was expected.
    pub fn check_value(&self, value: f64, whole: bool, shown: &str) -> Result<(), String> {
        if (self.integer && !whole) || !value.is_finite() || value < self.min || value > self.max {
            return Err(format!("{}, found {shown}", self.expected()));
        }
        Ok(())
    }

    /// What a value must be: `expected an integer from 1 to 1024`.
    pub fn expected(&self) -> String {
        let kind = if self.integer {
            "an integer"
        } else {
            "a number"
        };
        format!(
            "expected {kind} from {} to {}",
            self.show(self.min),
            self.show(self.max)
        )
    }

    /// A whole number from code (a configuration built without a file), located at the key
    /// and naming it (there is no file to point at).
    pub fn check_int(&self, value: impl Into<i128>) -> DataflowResult<()> {
        let value = value.into();
        self.check_value(value as f64, true, &value.to_string())
            .map_err(|m| self.error(m))
    }

    /// A decimal number from code, located at the key and naming it.
    pub fn check_real(&self, value: f64) -> DataflowResult<()> {
        self.check_value(value, false, &value.to_string())
            .map_err(|m| self.error(m))
    }

    fn error(&self, message: String) -> DataflowError {
        DataflowError::Config(format!("{}: {message}", self.key)).at(self.last_key())
    }

    /// The key inside its block (`max_size` of `batch.max_size`).
    fn last_key(&self) -> &'static str {
        self.key.rsplit('.').next().unwrap_or(self.key)
    }

    fn show(&self, v: f64) -> String {
        if self.integer {
            format!("{}", v as i64)
        } else {
            format!("{v}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_match_path_ends_and_say_what_was_expected() {
        let r = Range::int("batch.max_size", 1, 8);
        assert!(r.applies_to(&["model", "batch", "max_size"]));
        assert!(!r.applies_to(&["max_size"]));
        assert_eq!(
            r.check_value(9.0, true, "9").unwrap_err(),
            "expected an integer from 1 to 8, found 9"
        );
        assert!(r.check_value(2.5, false, "2.5").is_err());
        let e = Range::real("fps", 0.5, 10.0).check_real(0.0).unwrap_err();
        assert_eq!(e.located().0, Some("fps"));
        assert_eq!(
            e.to_string(),
            "fps: expected a number from 0.5 to 10, found 0"
        );
        assert!(Range::int("k", 1, 3).check_int(3u64).is_ok());
    }
}
