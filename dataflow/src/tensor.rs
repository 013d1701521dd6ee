//! Tensors in Arrow columns.
//!
//! A column of per-row tensors is a `FixedSizeList<T>` whose field carries the per-row shape in
//! its metadata under [`SHAPE_KEY`] (e.g. `"3,224,224"`). Because a fixed-size list stores all
//! rows' values in one contiguous child buffer, rows `a..b` of an `[N, ...]` tensor are one
//! slice of that buffer: a model batch is built without copying per record. A column of
//! scalars (one value per row) is a plain primitive column with shape `[]`.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::types::ArrowPrimitiveType;
use arrow_array::{Array, ArrayRef, BooleanArray, FixedSizeListArray, PrimitiveArray};
use arrow_schema::{DataType, Field};

use crate::error::{DataflowError, DataflowResult};

/// Field-metadata key holding a tensor column's per-row shape.
pub const SHAPE_KEY: &str = "riffle.tensor.shape";

/// Per-row shape of a tensor column: empty for a scalar column.
pub fn row_shape(field: &Field) -> DataflowResult<Vec<usize>> {
    match field.data_type() {
        DataType::FixedSizeList(_, size) => match field.metadata().get(SHAPE_KEY) {
            Some(text) => parse_shape(text).ok_or_else(|| {
                DataflowError::schema(field.name(), "a shape like \"3,224,224\"", text.clone())
            }),
            None => Ok(vec![*size as usize]),
        },
        _ => Ok(Vec::new()),
    }
}

/// Element type of a tensor column (the list's child type, or the column's own type).
pub fn element_type(field: &Field) -> DataType {
    match field.data_type() {
        DataType::FixedSizeList(child, _) => child.data_type().clone(),
        other => other.clone(),
    }
}

fn parse_shape(text: &str) -> Option<Vec<usize>> {
    if text.is_empty() {
        return Some(Vec::new());
    }
    text.split(',').map(|d| d.trim().parse().ok()).collect()
}

pub fn format_shape(shape: &[usize]) -> String {
    shape
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The field of a tensor column with `shape` per row (a scalar column when `shape` is empty).
pub fn tensor_field(name: &str, element: DataType, shape: &[usize]) -> Field {
    if shape.is_empty() {
        return Field::new(name, element, false);
    }
    let size: usize = shape.iter().product();
    let item = Arc::new(Field::new_list_field(element, false));
    Field::new(name, DataType::FixedSizeList(item, size as i32), false).with_metadata(
        HashMap::from([(SHAPE_KEY.to_string(), format_shape(shape))]),
    )
}

/// Wraps a flat value buffer of `rows × prod(shape)` elements as a tensor column.
pub fn tensor_column<T: ArrowPrimitiveType>(
    field: &Field,
    values: Vec<T::Native>,
) -> DataflowResult<ArrayRef> {
    as_tensor(
        field,
        Arc::new(PrimitiveArray::<T>::from_iter_values(values)),
    )
}

/// `values` as the column `field` describes: wrapped in its fixed-size list, or as is.
fn as_tensor(field: &Field, values: ArrayRef) -> DataflowResult<ArrayRef> {
    match field.data_type() {
        DataType::FixedSizeList(item, size) => Ok(Arc::new(FixedSizeListArray::try_new(
            item.clone(),
            *size,
            values,
            None,
        )?)),
        _ => Ok(values),
    }
}

/// A tensor column's values: the list's child, or the column itself.
fn tensor_child(column: &dyn Array) -> &dyn Array {
    // Slicing a fixed-size list slices its child too, so the child is exactly these rows.
    match column.as_any().downcast_ref::<FixedSizeListArray>() {
        Some(list) => list.values().as_ref(),
        None => column,
    }
}

/// The contiguous values of rows `0..len` of a tensor column (list child or the column itself).
pub fn tensor_values<T: ArrowPrimitiveType>(column: &dyn Array) -> DataflowResult<&[T::Native]> {
    let values = tensor_child(column);
    let prim = values
        .as_any()
        .downcast_ref::<PrimitiveArray<T>>()
        .ok_or_else(|| {
            DataflowError::schema(
                "tensor",
                format!("{} values", T::DATA_TYPE),
                values.data_type().to_string(),
            )
        })?;
    Ok(prim.values())
}

/// Wraps `rows × prod(shape)` booleans as a tensor column (Arrow packs them into bits, so unlike
/// [`tensor_column`] this is a copy).
pub fn bool_tensor_column(field: &Field, values: Vec<bool>) -> DataflowResult<ArrayRef> {
    as_tensor(field, Arc::new(BooleanArray::from(values)))
}

/// The values of rows `0..len` of a boolean tensor column, unpacked from Arrow's bits (a copy:
/// unlike [`tensor_values`], booleans cannot be viewed in place as one byte each).
pub fn bool_tensor_values(column: &dyn Array) -> DataflowResult<Vec<bool>> {
    let values = tensor_child(column);
    let bools = values
        .as_any()
        .downcast_ref::<BooleanArray>()
        .ok_or_else(|| {
            DataflowError::schema("tensor", "Boolean values", values.data_type().to_string())
        })?;
    Ok(bools.values().iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::types::Float32Type;

    #[test]
    fn tensor_column_round_trips_shape_and_values() {
        let field = tensor_field("t", DataType::Float32, &[2, 3]);
        assert_eq!(row_shape(&field).unwrap(), vec![2, 3]);
        let col =
            tensor_column::<Float32Type>(&field, (0..12).map(|v| v as f32).collect()).unwrap();
        assert_eq!(col.len(), 2);
        let sliced = col.slice(1, 1);
        let vals = tensor_values::<Float32Type>(sliced.as_ref()).unwrap();
        assert_eq!(vals, &[6.0, 7.0, 8.0, 9.0, 10.0, 11.0]);
    }

    #[test]
    fn bool_tensor_column_round_trips_through_bits() {
        let field = tensor_field("mask", DataType::Boolean, &[3]);
        let values = vec![true, false, true, false, false, true];
        let col = bool_tensor_column(&field, values.clone()).unwrap();
        assert_eq!(col.len(), 2);
        assert_eq!(col.data_type(), field.data_type());
        assert_eq!(bool_tensor_values(col.as_ref()).unwrap(), values);
        // A slice starting mid-byte still reads its own rows.
        let sliced = col.slice(1, 1);
        assert_eq!(
            bool_tensor_values(sliced.as_ref()).unwrap(),
            [false, false, true]
        );
        let scalar =
            bool_tensor_column(&tensor_field("b", DataType::Boolean, &[]), vec![true]).unwrap();
        assert_eq!(bool_tensor_values(scalar.as_ref()).unwrap(), [true]);
        let float_field = tensor_field("f", DataType::Float32, &[3]);
        let floats = tensor_column::<Float32Type>(&float_field, vec![0.0; 3]).unwrap();
        assert!(bool_tensor_values(floats.as_ref()).is_err());
    }

    #[test]
    fn scalar_column_has_empty_shape() {
        let field = tensor_field("s", DataType::Int64, &[]);
        assert!(row_shape(&field).unwrap().is_empty());
    }
}
