//! The ONNX Runtime engine's side of a batch: sessions (with the CUDA provider on a GPU, and
//! page-locked host memory), inputs viewed or copied from Arrow, outputs into Arrow columns.

use std::path::Path;

use arrow_array::types::{
    ArrowPrimitiveType, Float16Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type,
    Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef};
use arrow_schema::{DataType, Field};
use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::builder::GraphOptimizationLevel;
use ort::session::{Session, SessionInputValue};
use ort::value::{PrimitiveTensorElementType, Tensor, TensorRef};
use riffle_dataflow::tensor::{
    bool_tensor_column, bool_tensor_values, element_type, tensor_column, tensor_values,
};
use riffle_dataflow::{DataflowError, DataflowResult};

use super::{check_per_row, Backend, Engine};

pub(super) fn open_session(
    env: &ort::environment::Environment,
    path: &Path,
    threads: usize,
    engine: Engine,
) -> DataflowResult<Session> {
    let fail = |e: &dyn std::fmt::Display| {
        DataflowError::Config(format!("model {}: {e}", path.display())).at("path")
    };
    let mut builder = Session::builder(env)
        .map_err(|e| fail(&e))?
        // ONNX Runtime's own default, stated: every fusion and the CPU layout transforms (NCHWc).
        .with_optimization_level(GraphOptimizationLevel::All)
        .map_err(|e| fail(&e))?
        .with_intra_threads(threads)
        .map_err(|e| fail(&e))?
        // Workers already keep every core busy; spinning threads would steal from them.
        .with_intra_op_spinning(false)
        .map_err(|e| fail(&e))?;
    if let Engine::OrtCuda(n) = engine {
        let cuda = ort::ep::CUDA::default()
            .with_device_id(n as i32)
            .build()
            .error_on_failure();
        builder = builder
            .with_execution_providers([cuda])
            .map_err(|e| fail(&e))?;
    }
    builder.commit_from_file(path).map_err(|e| fail(&e))
}

/// One run on zeros (batch 1) before the first batch, as servers warm a model: ONNX Runtime's
/// first run allocates and plans, which would otherwise land on the first frames' latency.
/// Skipped for inputs of unknown size past the batch dimension or of types zeros are not made
/// for here; a failing warm-up (a model that rejects zeros) is only logged.
pub(super) fn warm(
    session: &mut Session,
    inputs: &[crate::inference::onnx::TensorSpec],
    path: &Path,
) {
    fn zeros<T: PrimitiveTensorElementType + Default + Clone + std::fmt::Debug + 'static>(
        shape: Vec<i64>,
        n: usize,
    ) -> Option<ort::value::DynValue> {
        Tensor::from_array((shape, vec![T::default(); n]))
            .ok()
            .map(|t| t.into_dyn())
    }
    let mut values: Vec<(String, SessionInputValue<'_>)> = Vec::new();
    for spec in inputs {
        if spec.shape.iter().skip(1).any(|d| *d < 0) {
            return;
        }
        let mut shape = spec.shape.clone();
        if let Some(first) = shape.first_mut().filter(|d| **d < 0) {
            *first = 1;
        }
        let Ok(n) = usize::try_from(shape.iter().product::<i64>()) else {
            return;
        };
        let value = match spec.element {
            DataType::Float32 => zeros::<f32>(shape, n),
            DataType::UInt8 => zeros::<u8>(shape, n),
            DataType::Int64 => zeros::<i64>(shape, n),
            DataType::Int32 => zeros::<i32>(shape, n),
            _ => None,
        };
        match value {
            Some(v) => values.push((spec.name.clone(), v.into())),
            None => return,
        }
    }
    if let Err(e) = session.run(values) {
        tracing::debug!(model = %path.display(), "warm-up run on zeros failed: {e}");
    }
}

pub(super) fn pinned_backend(session: Session, gpu: usize, path: &Path) -> DataflowResult<Backend> {
    let fail = |e: ort::Error| {
        DataflowError::Config(format!("model {} on cuda:{gpu}: {e}", path.display()))
    };
    let pinned_memory = |kind| {
        MemoryInfo::new(
            AllocationDevice::CUDA_PINNED,
            gpu as i32,
            AllocatorType::Device,
            kind,
        )
    };
    let pinned = Allocator::new(&session, pinned_memory(MemoryType::CPUInput).map_err(fail)?)
        .map_err(fail)?;
    let output_memory = pinned_memory(MemoryType::CPUOutput).map_err(fail)?;
    Ok(Backend::OrtCuda {
        session,
        pinned,
        output_memory,
    })
}

pub(super) fn ort_output<'a>(
    outputs: &'a ort::session::SessionOutputs<'_>,
    name: &str,
) -> DataflowResult<&'a ort::value::DynValue> {
    outputs.get(name).ok_or_else(|| {
        DataflowError::stage("model", format!("output `{name}` missing from the run"))
    })
}

/// The input copied into page-locked memory from `allocator`.
pub(super) fn pinned_input(
    allocator: &Allocator,
    array: &dyn Array,
    element: &DataType,
    shape: Vec<i64>,
) -> DataflowResult<ort::value::DynValue> {
    fn copy<T>(
        allocator: &Allocator,
        values: &[T],
        shape: Vec<i64>,
    ) -> DataflowResult<ort::value::DynValue>
    where
        T: PrimitiveTensorElementType + Copy + std::fmt::Debug + 'static,
    {
        let fail = |e: ort::Error| DataflowError::stage("model", e);
        let mut tensor = Tensor::<T>::new(allocator, shape).map_err(fail)?;
        let (_, dst) = tensor.try_extract_tensor_mut().map_err(fail)?;
        if dst.len() != values.len() {
            return Err(DataflowError::stage(
                "model",
                format!(
                    "pinned input holds {} values, the column {}",
                    dst.len(),
                    values.len()
                ),
            ));
        }
        dst.copy_from_slice(values);
        Ok(tensor.into_dyn())
    }
    let a = array;
    match element {
        DataType::Float16 => copy(allocator, tensor_values::<Float16Type>(a)?, shape),
        DataType::Float32 => copy(allocator, tensor_values::<Float32Type>(a)?, shape),
        DataType::Float64 => copy(allocator, tensor_values::<Float64Type>(a)?, shape),
        DataType::UInt8 => copy(allocator, tensor_values::<UInt8Type>(a)?, shape),
        DataType::Int8 => copy(allocator, tensor_values::<Int8Type>(a)?, shape),
        DataType::UInt16 => copy(allocator, tensor_values::<UInt16Type>(a)?, shape),
        DataType::Int16 => copy(allocator, tensor_values::<Int16Type>(a)?, shape),
        DataType::UInt32 => copy(allocator, tensor_values::<UInt32Type>(a)?, shape),
        DataType::Int32 => copy(allocator, tensor_values::<Int32Type>(a)?, shape),
        DataType::UInt64 => copy(allocator, tensor_values::<UInt64Type>(a)?, shape),
        DataType::Int64 => copy(allocator, tensor_values::<Int64Type>(a)?, shape),
        DataType::Boolean => {
            // Not in pinned memory: its uninitialised bytes would be viewed as `bool`s before
            // they are written. ONNX Runtime copies this (small) tensor to the GPU itself.
            Tensor::from_array((shape, bool_tensor_values(a)?))
                .map(|t| t.into_dyn())
                .map_err(|e| DataflowError::stage("model", e))
        }
        other => Err(unsupported_input(other)),
    }
}

pub(super) fn tensor_input<'a>(
    array: &'a dyn Array,
    element: &DataType,
    shape: Vec<i64>,
) -> DataflowResult<SessionInputValue<'a>> {
    fn view<'a, T>(array: &'a dyn Array, shape: Vec<i64>) -> DataflowResult<SessionInputValue<'a>>
    where
        T: ArrowPrimitiveType,
        T::Native: PrimitiveTensorElementType + Clone + std::fmt::Debug + 'static,
    {
        // Zero-copy: ONNX Runtime reads the Arrow buffer in place.
        let values = tensor_values::<T>(array)?;
        let tensor = TensorRef::from_array_view((shape, values))
            .map_err(|e| DataflowError::stage("model", e))?;
        Ok(tensor.into())
    }
    match element {
        DataType::Float16 => view::<Float16Type>(array, shape),
        DataType::Float32 => view::<Float32Type>(array, shape),
        DataType::Float64 => view::<Float64Type>(array, shape),
        DataType::UInt8 => view::<UInt8Type>(array, shape),
        DataType::Int8 => view::<Int8Type>(array, shape),
        DataType::UInt16 => view::<UInt16Type>(array, shape),
        DataType::Int16 => view::<Int16Type>(array, shape),
        DataType::UInt32 => view::<UInt32Type>(array, shape),
        DataType::Int32 => view::<Int32Type>(array, shape),
        DataType::UInt64 => view::<UInt64Type>(array, shape),
        DataType::Int64 => view::<Int64Type>(array, shape),
        DataType::Boolean => {
            // Arrow packs booleans into bits and ONNX Runtime wants a byte each: a copy.
            let tensor = Tensor::from_array((shape, bool_tensor_values(array)?))
                .map_err(|e| DataflowError::stage("model", e))?;
            Ok(tensor.into())
        }
        other => Err(unsupported_input(other)),
    }
}

/// The element types a tensor column may have to feed ONNX Runtime.
const SUPPORTED: &str = "float16, float32, float64, (u)int8, (u)int16, (u)int32, (u)int64 or bool";

fn unsupported_input(element: &DataType) -> DataflowError {
    DataflowError::schema(
        "model input",
        format!("a tensor column of {SUPPORTED}"),
        element.to_string(),
    )
}

pub(super) fn output_column(
    value: &ort::value::DynValue,
    field: &Field,
    rows: usize,
) -> DataflowResult<ArrayRef> {
    /// The output's values, once its shape is checked against the column's.
    fn checked<'v, T: PrimitiveTensorElementType>(
        value: &'v ort::value::DynValue,
        field: &Field,
        rows: usize,
    ) -> DataflowResult<&'v [T]> {
        let (shape, data) = value
            .try_extract_tensor::<T>()
            .map_err(|e| DataflowError::stage("model", e))?;
        if shape.first().copied() != Some(rows as i64) {
            return Err(DataflowError::stage(
                "model",
                format!(
                    "output `{}` has shape {shape:?}, expected {rows} rows",
                    field.name()
                ),
            ));
        }
        let per_row = shape.iter().skip(1).map(|d| *d as usize).product();
        check_per_row(field, per_row, &shape)?;
        Ok(data)
    }
    fn extract<T>(
        value: &ort::value::DynValue,
        field: &Field,
        rows: usize,
    ) -> DataflowResult<ArrayRef>
    where
        T: ArrowPrimitiveType,
        T::Native: PrimitiveTensorElementType,
    {
        tensor_column::<T>(field, checked::<T::Native>(value, field, rows)?.to_vec())
    }
    match element_type(field) {
        DataType::Float16 => extract::<Float16Type>(value, field, rows),
        DataType::Float32 => extract::<Float32Type>(value, field, rows),
        DataType::Float64 => extract::<Float64Type>(value, field, rows),
        DataType::UInt8 => extract::<UInt8Type>(value, field, rows),
        DataType::Int8 => extract::<Int8Type>(value, field, rows),
        DataType::UInt16 => extract::<UInt16Type>(value, field, rows),
        DataType::Int16 => extract::<Int16Type>(value, field, rows),
        DataType::UInt32 => extract::<UInt32Type>(value, field, rows),
        DataType::Int32 => extract::<Int32Type>(value, field, rows),
        DataType::UInt64 => extract::<UInt64Type>(value, field, rows),
        DataType::Int64 => extract::<Int64Type>(value, field, rows),
        DataType::Boolean => {
            bool_tensor_column(field, checked::<bool>(value, field, rows)?.to_vec())
        }
        other => Err(DataflowError::schema(
            field.name(),
            format!("an output of {SUPPORTED}"),
            other.to_string(),
        )),
    }
}
