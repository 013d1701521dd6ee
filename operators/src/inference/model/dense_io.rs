//! The dense executor's side of a batch: mapped columns in, configured outputs out.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::types::{Float32Type, Int64Type};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field};
use riffle_dataflow::tensor::{tensor_column, tensor_values};
use riffle_dataflow::{DataflowError, DataflowResult};

use super::{check_per_row, input_column};
use crate::inference::dense::{Data as DenseData, Tensor as DenseTensor};

/// The dense executor's inputs (float32 and int64 tensors) from the mapped columns.
pub(super) fn dense_inputs<'a>(
    batch: &RecordBatch,
    mapping: &'a BTreeMap<String, String>,
) -> DataflowResult<Vec<(&'a str, DenseTensor)>> {
    mapping
        .iter()
        .map(|(name, column)| {
            let (array, element, shape) = input_column(batch, column)?;
            let shape: Vec<usize> = shape.iter().map(|d| *d as usize).collect();
            let tensor = match element {
                DataType::Float32 => {
                    DenseTensor::f32(shape, tensor_values::<Float32Type>(array)?.to_vec())
                }
                DataType::Int64 => {
                    DenseTensor::i64(shape, tensor_values::<Int64Type>(array)?.to_vec())
                }
                other => {
                    return Err(DataflowError::schema(
                        column,
                        "a float32 or int64 tensor column (dense executor)",
                        other.to_string(),
                    ))
                }
            };
            Ok((name.as_str(), tensor))
        })
        .collect()
}

/// Appends the configured outputs of a dense run (`names`: the graph's outputs, in order).
pub(super) fn push_dense_outputs<'a>(
    columns: &mut Vec<ArrayRef>,
    names: &[String],
    mut outputs: Vec<DenseTensor>,
    fields: &[Arc<Field>],
    wanted: impl Iterator<Item = &'a String>,
    rows: usize,
) -> DataflowResult<()> {
    for (field, name) in fields.iter().zip(wanted) {
        let slot = names
            .iter()
            .position(|n| n == name)
            .and_then(|at| outputs.get_mut(at))
            .ok_or_else(|| {
                DataflowError::stage("model", format!("output `{name}` missing from the run"))
            })?;
        let tensor = std::mem::replace(slot, DenseTensor::f32(vec![0], Vec::new()));
        if tensor.shape.first() != Some(&rows) {
            return Err(DataflowError::stage(
                "model",
                format!(
                    "output `{name}` has shape {:?}, expected {rows} rows",
                    tensor.shape
                ),
            ));
        }
        check_per_row(field, tensor.shape.iter().skip(1).product(), &tensor.shape)?;
        columns.push(match tensor.data {
            DenseData::F32(v) => tensor_column::<Float32Type>(field, v)?,
            DenseData::I64(v) => tensor_column::<Int64Type>(field, v)?,
        });
    }
    Ok(())
}
