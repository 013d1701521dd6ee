//! The ONNX Runtime engine's side of a batch: sessions (with the CUDA provider on a GPU, and
//! page-locked host memory), inputs viewed or copied from Arrow, outputs into Arrow columns.

use std::path::Path;

use arrow_array::types::{
    ArrowPrimitiveType, Float32Type, Float64Type, Int32Type, Int64Type, Int8Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef};
use arrow_schema::{DataType, Field};
use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{Session, SessionInputValue};
use ort::value::{PrimitiveTensorElementType, TensorRef};
use riffle_dataflow::tensor::{element_type, tensor_column, tensor_values};
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
        array: &dyn Array,
        shape: Vec<i64>,
    ) -> DataflowResult<ort::value::DynValue>
    where
        T: ArrowPrimitiveType,
        T::Native: PrimitiveTensorElementType + Copy + std::fmt::Debug + 'static,
    {
        let fail = |e: ort::Error| DataflowError::stage("model", e);
        let values = tensor_values::<T>(array)?;
        let mut tensor = ort::value::Tensor::<T::Native>::new(allocator, shape).map_err(fail)?;
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
    match element {
        DataType::Float32 => copy::<Float32Type>(allocator, array, shape),
        DataType::Float64 => copy::<Float64Type>(allocator, array, shape),
        DataType::UInt8 => copy::<UInt8Type>(allocator, array, shape),
        DataType::Int8 => copy::<Int8Type>(allocator, array, shape),
        DataType::Int32 => copy::<Int32Type>(allocator, array, shape),
        DataType::Int64 => copy::<Int64Type>(allocator, array, shape),
        other => Err(DataflowError::schema(
            "model input",
            "a numeric tensor column",
            other.to_string(),
        )),
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
        DataType::Float32 => view::<Float32Type>(array, shape),
        DataType::Float64 => view::<Float64Type>(array, shape),
        DataType::UInt8 => view::<UInt8Type>(array, shape),
        DataType::Int8 => view::<Int8Type>(array, shape),
        DataType::Int32 => view::<Int32Type>(array, shape),
        DataType::Int64 => view::<Int64Type>(array, shape),
        other => Err(DataflowError::schema(
            "model input",
            "a numeric tensor column",
            other.to_string(),
        )),
    }
}

pub(super) fn output_column(
    value: &ort::value::DynValue,
    field: &Field,
    rows: usize,
) -> DataflowResult<ArrayRef> {
    fn extract<T>(
        value: &ort::value::DynValue,
        field: &Field,
        rows: usize,
    ) -> DataflowResult<ArrayRef>
    where
        T: ArrowPrimitiveType,
        T::Native: PrimitiveTensorElementType + Clone,
    {
        let (shape, data) = value
            .try_extract_tensor::<T::Native>()
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
        tensor_column::<T>(field, data.to_vec())
    }
    match element_type(field) {
        DataType::Float32 => extract::<Float32Type>(value, field, rows),
        DataType::Float64 => extract::<Float64Type>(value, field, rows),
        DataType::UInt8 => extract::<UInt8Type>(value, field, rows),
        DataType::Int8 => extract::<Int8Type>(value, field, rows),
        DataType::Int32 => extract::<Int32Type>(value, field, rows),
        DataType::Int64 => extract::<Int64Type>(value, field, rows),
        other => Err(DataflowError::schema(
            field.name(),
            "a numeric output",
            other.to_string(),
        )),
    }
}
