//! Values of the source columns as the tensor's: whether a type converts, why a value did not,
//! and a list column's `k` values per row.

use arrow_array::{Array, ArrayRef, UInt64Array};
use arrow_cast::cast::can_cast_types;
use arrow_cast::display::array_value_to_string;
use arrow_schema::DataType;
use riffle_dataflow::DataflowResult;

/// Whether values of `from` convert to numbers of `to` (numbers, booleans, text).
pub(super) fn convertible(from: &DataType, to: &DataType) -> bool {
    !from.is_nested() && can_cast_types(from, to)
}

/// Why element `i` of `source` did not convert: it is null, or not a number of `dtype`.
pub(super) fn unconverted(source: &dyn Array, i: usize, what: &str, dtype: &str) -> String {
    if source.is_null(i) {
        return format!("{what} is null");
    }
    let value = array_value_to_string(source, i).unwrap_or_else(|_| "the value".to_string());
    format!("{what}: {value:?} is not a valid {dtype}")
}

/// The values of each row of a variable-length list, `k` per row (nulls for rows that are null
/// or hold another number of values, which get their reason).
pub(super) fn gather(
    values: &ArrayRef,
    list: &dyn Array,
    offsets: impl Iterator<Item = i64>,
    k: usize,
    name: &str,
    reasons: &mut [Option<String>],
) -> DataflowResult<ArrayRef> {
    let mut indices: Vec<Option<u64>> = Vec::with_capacity(reasons.len() * k);
    let mut offsets = offsets;
    let mut start = offsets.next().unwrap_or(0);
    for (r, reason) in reasons.iter_mut().enumerate() {
        let end = offsets.next().unwrap_or(start);
        let len = usize::try_from(end - start).unwrap_or(0);
        if list.is_null(r) {
            *reason = Some(format!("column `{name}` is null"));
        } else if len != k {
            *reason = Some(format!("column `{name}` has {len} values, expected {k}"));
        }
        if reason.is_some() {
            indices.extend(std::iter::repeat_n(None, k));
        } else {
            indices.extend((0..k).map(|j| u64::try_from(start).ok().map(|s| s + j as u64)));
        }
        start = end;
    }
    Ok(arrow_select::take::take(
        values.as_ref(),
        &UInt64Array::from(indices),
        None,
    )?)
}
