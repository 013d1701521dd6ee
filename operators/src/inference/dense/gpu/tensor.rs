//! Tensors on a device: their shape and buffer, and their copies to and from host memory.

use std::sync::Arc;

use riffle_dataflow::DataflowResult;
use riffle_gpu::GpuDevice;

use crate::gpu_error;
use crate::inference::dense::{err, Data, Tensor};

pub(super) enum DData<D: GpuDevice> {
    F32(Arc<D::Buf<f32>>),
    I64(Arc<D::Buf<i64>>),
}

// By hand: derived, they would ask for `D: Clone`.
impl<D: GpuDevice> Clone for DData<D> {
    fn clone(&self) -> Self {
        match self {
            DData::F32(s) => DData::F32(s.clone()),
            DData::I64(s) => DData::I64(s.clone()),
        }
    }
}

/// A tensor on a device.
pub(super) struct DTensor<D: GpuDevice> {
    pub(super) shape: Vec<usize>,
    pub(super) data: DData<D>,
}

impl<D: GpuDevice> Clone for DTensor<D> {
    fn clone(&self) -> Self {
        DTensor {
            shape: self.shape.clone(),
            data: self.data.clone(),
        }
    }
}

impl<D: GpuDevice> DTensor<D> {
    /// The elements its shape holds; an error when their count overflows.
    pub(super) fn len(&self) -> DataflowResult<usize> {
        super::elements("tensor", &self.shape)
    }

    pub(super) fn f32(&self) -> DataflowResult<&D::Buf<f32>> {
        match &self.data {
            DData::F32(s) => Ok(s),
            DData::I64(_) => Err(err("expected a float tensor on the GPU, found int64")),
        }
    }

    pub(super) fn with_f32(shape: Vec<usize>, buf: D::Buf<f32>) -> DTensor<D> {
        DTensor {
            shape,
            data: DData::F32(Arc::new(buf)),
        }
    }
}

pub(super) fn upload<D: GpuDevice>(device: &D, t: &Tensor) -> DataflowResult<DTensor<D>> {
    let data = match &t.data {
        Data::F32(v) => DData::F32(Arc::new(device.upload(v).map_err(gpu_error)?)),
        Data::I64(v) => DData::I64(Arc::new(device.upload(v).map_err(gpu_error)?)),
    };
    Ok(DTensor {
        shape: t.shape.clone(),
        data,
    })
}

/// `t` in host memory (its buffer may be longer: empty tensors get one element).
pub(super) fn download<D: GpuDevice>(device: &D, t: &DTensor<D>) -> DataflowResult<Tensor> {
    Ok(match &t.data {
        DData::F32(s) => Tensor::f32(
            t.shape.clone(),
            device.download(s, t.len()?).map_err(gpu_error)?,
        ),
        DData::I64(s) => Tensor::i64(
            t.shape.clone(),
            device.download(s, t.len()?).map_err(gpu_error)?,
        ),
    })
}
