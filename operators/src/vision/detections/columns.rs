//! Reading the stage's input columns: float32 tensor columns (checked in a schema, read in a
//! batch) and the `UInt32` image-size columns.

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, UInt32Type};
use arrow_array::{FixedSizeListArray, RecordBatch, UInt32Array};
use arrow_schema::{DataType, Schema};
use riffle_dataflow::tensor::{element_type, row_shape, tensor_values};
use riffle_dataflow::{DataflowError, DataflowResult};

/// Checks that `name` is a UInt32 image-size column.
pub(super) fn size_field(input: &Schema, name: &str, why: &str) -> DataflowResult<()> {
    match input.field_with_name(name) {
        Ok(f) if f.data_type() == &DataType::UInt32 => Ok(()),
        Ok(f) => Err(DataflowError::schema(
            name,
            "UInt32 image size",
            f.data_type().to_string(),
        )),
        Err(_) => Err(DataflowError::schema(
            name,
            format!("UInt32 image size ({why})"),
            "no such column",
        )),
    }
}

/// Elements per row of the f32 tensor column `name`.
pub(super) fn tensor_size(input: &Schema, name: &str) -> DataflowResult<usize> {
    let field = input
        .field_with_name(name)
        .map_err(|_| DataflowError::schema(name, "a float32 tensor column", "no such column"))?;
    let is_tensor = matches!(field.data_type(), DataType::FixedSizeList(_, _));
    if !is_tensor || element_type(field) != DataType::Float32 {
        return Err(DataflowError::schema(
            name,
            "a float32 tensor column (FixedSizeList<Float32>)",
            field.data_type().to_string(),
        ));
    }
    Ok(row_shape(field)?.iter().product())
}

/// The tensor column `name` of `batch` and its contiguous values.
pub(super) fn tensor<'a>(
    batch: &'a RecordBatch,
    name: &str,
) -> DataflowResult<(&'a FixedSizeListArray, &'a [f32])> {
    let column = batch
        .column_by_name(name)
        .ok_or_else(|| DataflowError::schema(name, "a column", "none"))?;
    let list = column.as_fixed_size_list_opt().ok_or_else(|| {
        DataflowError::schema(
            name,
            "FixedSizeList<Float32>",
            column.data_type().to_string(),
        )
    })?;
    Ok((list, tensor_values::<Float32Type>(list)?))
}

pub(super) fn size_column<'a>(batch: &'a RecordBatch, name: &str) -> Option<&'a UInt32Array> {
    batch
        .column_by_name(name)
        .and_then(|c| c.as_primitive_opt::<UInt32Type>())
}
