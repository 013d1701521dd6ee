//! Exchange compression: how FP32 activations shrink on their way between processes.
//!
//! A [`Batch`](crate::Batch) carries a [`Compression`]. Only when timely serialises it for
//! another process does [`encode`] rewrite its columns, and the receiver's [`decode`] restores
//! the original schema; within a process batches move by pointer and nothing is encoded.
//!
//! - [`Compression::Fp16`]: every `Float32` and `FixedSizeList<Float32>` column travels as
//!   `Float16` / `FixedSizeList<Float16>`, half the bytes. Values are rounded to nearest: the
//!   relative error is at most 2^-11 for normal values (|x| ≥ 2^-14), the absolute error at
//!   most 2^-25 below that. Finite values beyond ±65504 (the largest finite FP16) saturate to
//!   ±65504 instead of becoming infinite; ±∞ and NaN are kept.
//! - [`Compression::Sparse`]: every `FixedSizeList<Float32>` column (a tensor) travels as
//!   `List<Struct{i: UInt32, <item>: Float32}>`, one (index, value) entry per non-zero element
//!   of each row; the value field is the tensor's own list item field, so it is restored
//!   verbatim. An entry costs 8 bytes against 4 for a dense element, so a column is encoded only
//!   when that is smaller: more than about half of its values zero. Lossless: "zero" means the
//!   bit pattern of +0.0, so -0.0 and NaN travel as entries. Tensors with null elements (not
//!   null rows) are left dense.
//!
//! Encoded fields carry [`COMPRESSION_KEY`] (and [`SIZE_KEY`] for sparse) in their metadata
//! beside their own keys (such as [`crate::tensor::SHAPE_KEY`]); [`decode`] reads those and
//! leaves every other column untouched, so decoding a batch that was never encoded is a no-op.
//! Row validity is kept by both encodings.

use std::sync::Arc;

use arrow_array::types::{ArrowPrimitiveType, Float16Type, Float32Type};
use arrow_array::{
    Array, ArrayRef, FixedSizeListArray, Float16Array, Float32Array, ListArray, PrimitiveArray,
    RecordBatch, RecordBatchOptions, StructArray, UInt32Array,
};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{DataType, Field, FieldRef, Fields, Schema};
use half::f16;
use half::slice::HalfFloatSliceExt;
use serde::{Deserialize, Serialize};

use crate::error::{DataflowError, DataflowResult};

/// Field-metadata key naming how an encoded column was compressed (`fp16` or `sparse`).
pub const COMPRESSION_KEY: &str = "riffle.compression";
/// Field-metadata key holding a sparse column's elements per row (the tensor's list size).
pub const SIZE_KEY: &str = "riffle.compression.size";

/// Name of the index field in a sparse column's entries.
const INDEX_FIELD: &str = "i";
/// Name of a sparse column's list item (the entry struct).
const ENTRY_FIELD: &str = "entries";
/// Largest finite FP16 value; finite values beyond it saturate rather than become infinite.
const F16_MAX: f32 = 65504.0;
/// Values clamped on the stack per call to half's vectorised slice conversion.
const CHUNK: usize = 1024;

/// How a batch's FP32 columns are encoded when it crosses a process boundary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    /// Columns travel as they are.
    #[default]
    None,
    /// `Float32` columns and tensors travel as `Float16`.
    Fp16,
    /// Mostly-zero `Float32` tensors travel as (index, value) pairs.
    Sparse,
}

impl Compression {
    /// The value of [`COMPRESSION_KEY`] on a field encoded this way.
    pub fn tag(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Fp16 => "fp16",
            Compression::Sparse => "sparse",
        }
    }
}

/// `batch` with its FP32 columns encoded `how` (see the [module docs](self)); other columns,
/// and columns that are already encoded, are shared untouched.
///
/// ```
/// use std::sync::Arc;
/// use arrow_array::{Array, Float32Array, RecordBatch};
/// use arrow_array::cast::AsArray;
/// use arrow_array::types::Float32Type;
/// use arrow_schema::DataType;
/// use riffle_dataflow::compression::{decode, encode, Compression};
///
/// let scores = Float32Array::from(vec![0.1, 0.5, 1e6]);
/// let batch = RecordBatch::try_from_iter([("score", Arc::new(scores) as _)]).unwrap();
///
/// let wire = encode(&batch, Compression::Fp16).unwrap();
/// assert_eq!(wire.column(0).data_type(), &DataType::Float16);
///
/// let back = decode(&wire).unwrap();
/// assert_eq!(back.schema(), batch.schema());
/// let back = back.column(0).as_primitive::<Float32Type>();
/// assert!((back.value(0) - 0.1).abs() <= 0.1 / 2048.0);
/// assert_eq!(back.value(1), 0.5);
/// assert_eq!(back.value(2), 65504.0); // saturated
/// ```
pub fn encode(batch: &RecordBatch, how: Compression) -> DataflowResult<RecordBatch> {
    let encode_column = match how {
        Compression::None => return Ok(batch.clone()),
        Compression::Fp16 => encode_fp16,
        Compression::Sparse => encode_sparse,
    };
    rewrite_columns(batch, |field, column| {
        if field.metadata().contains_key(COMPRESSION_KEY) {
            return Ok(None);
        }
        encode_column(field, column)
    })
}

/// `batch` with every column [`encode`] rewrote restored to its original field and type
/// (FP16 values widened back to FP32, within FP16 rounding); the same batch when none was.
pub fn decode(batch: &RecordBatch) -> DataflowResult<RecordBatch> {
    rewrite_columns(batch, decode_column)
}

/// A replacement field and column, or `None` to keep the column as it is.
type Rewritten = Option<(Field, ArrayRef)>;

/// `batch` with each column that `rewrite` returns a replacement for replaced.
fn rewrite_columns(
    batch: &RecordBatch,
    rewrite: impl Fn(&Field, &ArrayRef) -> DataflowResult<Rewritten>,
) -> DataflowResult<RecordBatch> {
    let schema = batch.schema();
    let mut fields: Vec<FieldRef> = schema.fields().iter().cloned().collect();
    let mut columns = batch.columns().to_vec();
    let mut changed = false;
    for (field, column) in fields.iter_mut().zip(columns.iter_mut()) {
        if let Some((new_field, new_column)) = rewrite(field, column)? {
            *field = Arc::new(new_field);
            *column = new_column;
            changed = true;
        }
    }
    if !changed {
        return Ok(batch.clone());
    }
    let schema = Schema::new_with_metadata(fields, schema.metadata().clone());
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    Ok(RecordBatch::try_new_with_options(
        Arc::new(schema),
        columns,
        &options,
    )?)
}

fn encode_fp16(field: &Field, column: &ArrayRef) -> DataflowResult<Rewritten> {
    let encoded = convert_floats::<Float32Type, Float16Type>(field, column, to_f16)?;
    Ok(encoded.map(|encoded| {
        let field = tagged(field, encoded.data_type(), Compression::Fp16, None);
        (field, encoded)
    }))
}

fn encode_sparse(field: &Field, column: &ArrayRef) -> DataflowResult<Rewritten> {
    let DataType::FixedSizeList(item, size) = field.data_type() else {
        return Ok(None);
    };
    if item.data_type() != &DataType::Float32 {
        return Ok(None);
    }
    let list = downcast::<FixedSizeListArray>(field, column, "FixedSizeList<Float32>")?;
    let values = downcast::<Float32Array>(field, list.values(), "Float32 values")?;
    let width = *size as usize;
    let rows = list.len();
    // Entries cost 8 bytes and offsets 4 per row, against 4 bytes per dense element.
    if values.null_count() > 0 || rows + 1 >= rows * width {
        return Ok(None);
    }
    // Null rows contribute no entries (and decode to zeros under their null bit).
    let row_values = || {
        values
            .values()
            .chunks_exact(width)
            .enumerate()
            .map(|(row, dense)| if list.is_valid(row) { dense } else { &[] })
    };
    let non_zero: usize = row_values()
        .map(|dense| dense.iter().filter(|v| is_stored(**v)).count())
        .sum();
    if 2 * non_zero + rows + 1 >= rows * width || non_zero > i32::MAX as usize {
        return Ok(None);
    }

    let mut offsets = Vec::with_capacity(rows + 1);
    let mut indices = Vec::with_capacity(non_zero);
    let mut kept = Vec::with_capacity(non_zero);
    offsets.push(0i32);
    for dense in row_values() {
        for (index, &value) in dense.iter().enumerate() {
            if is_stored(value) {
                indices.push(index as u32);
                kept.push(value);
            }
        }
        offsets.push(indices.len() as i32);
    }
    let entry_fields = Fields::from(vec![
        Field::new(INDEX_FIELD, DataType::UInt32, false),
        item.as_ref().clone(),
    ]);
    let entries = StructArray::try_new(
        entry_fields.clone(),
        vec![
            Arc::new(UInt32Array::from(indices)),
            Arc::new(Float32Array::from(kept)),
        ],
        None,
    )?;
    let entry = Arc::new(Field::new(
        ENTRY_FIELD,
        DataType::Struct(entry_fields),
        false,
    ));
    let sparse: ArrayRef = Arc::new(ListArray::try_new(
        entry,
        OffsetBuffer::new(offsets.into()),
        Arc::new(entries),
        list.nulls().cloned(),
    )?);
    let field = tagged(field, sparse.data_type(), Compression::Sparse, Some(*size));
    Ok(Some((field, sparse)))
}

/// Whether a sparse column keeps `value` as an entry: anything but the bits of +0.0.
fn is_stored(value: f32) -> bool {
    value.to_bits() != 0
}

fn decode_column(field: &Field, column: &ArrayRef) -> DataflowResult<Rewritten> {
    let Some(tag) = field.metadata().get(COMPRESSION_KEY) else {
        return Ok(None);
    };
    let restored = if tag == Compression::Fp16.tag() {
        convert_floats::<Float16Type, Float32Type>(field, column, to_f32)?.ok_or_else(|| {
            DataflowError::schema(
                field.name(),
                "Float16 or FixedSizeList<Float16> (fp16-encoded)",
                field.data_type().to_string(),
            )
        })?
    } else if tag == Compression::Sparse.tag() {
        decode_sparse(field, column)?
    } else {
        return Err(DataflowError::schema(
            field.name(),
            format!("{COMPRESSION_KEY} \"fp16\" or \"sparse\""),
            tag.clone(),
        ));
    };
    let mut metadata = field.metadata().clone();
    metadata.remove(COMPRESSION_KEY);
    metadata.remove(SIZE_KEY);
    let field = field
        .clone()
        .with_data_type(restored.data_type().clone())
        .with_metadata(metadata);
    Ok(Some((field, restored)))
}

#[allow(
    clippy::indexing_slicing,
    reason = "offset windows hold 2 items; `dense` has `width` values per row; the entries were checked to have 2 fields"
)]
fn decode_sparse(field: &Field, column: &ArrayRef) -> DataflowResult<ArrayRef> {
    let bad = |expected: &str, found: String| DataflowError::schema(field.name(), expected, found);
    let size_text = field.metadata().get(SIZE_KEY).cloned().unwrap_or_default();
    let size: i32 = size_text
        .parse()
        .ok()
        .filter(|size| *size > 0)
        .ok_or_else(|| bad("a positive riffle.compression.size", size_text.clone()))?;
    let width = size as usize;
    let list = downcast::<ListArray>(field, column, "List<Struct{i, value}> (sparse-encoded)")?;
    let entries = downcast::<StructArray>(field, list.values(), "Struct{i, value} entries")?;
    if entries.num_columns() != 2 {
        return Err(bad(
            "entries with 2 fields",
            entries.num_columns().to_string(),
        ));
    }
    let indices = downcast::<UInt32Array>(field, entries.column(0), "UInt32 indices")?.values();
    let values = downcast::<Float32Array>(field, entries.column(1), "Float32 values")?.values();
    let mut dense = vec![0f32; list.len() * width];
    for (row, bounds) in list.value_offsets().windows(2).enumerate() {
        let range = bounds[0] as usize..bounds[1] as usize;
        let (Some(row_indices), Some(row_values)) =
            (indices.get(range.clone()), values.get(range.clone()))
        else {
            return Err(bad(
                "entry offsets within the entries",
                format!("{range:?} in row {row}"),
            ));
        };
        let out = &mut dense[row * width..(row + 1) * width];
        for (&index, &value) in row_indices.iter().zip(row_values) {
            let slot = out.get_mut(index as usize).ok_or_else(|| {
                bad(
                    &format!("indices below {width}"),
                    format!("{index} in row {row}"),
                )
            })?;
            *slot = value;
        }
    }
    // The value field is the tensor's own list item field.
    let item = entries.fields()[1].clone();
    Ok(Arc::new(FixedSizeListArray::try_new(
        item,
        size,
        Arc::new(Float32Array::from(dense)),
        list.nulls().cloned(),
    )?))
}

/// `column` converted element-wise by `convert` when it is a `From` column or a fixed-size list
/// of them (keeping the list's item field apart from its type); `None` for any other column.
fn convert_floats<From, To>(
    field: &Field,
    column: &ArrayRef,
    convert: fn(&PrimitiveArray<From>) -> PrimitiveArray<To>,
) -> DataflowResult<Option<ArrayRef>>
where
    From: ArrowPrimitiveType,
    To: ArrowPrimitiveType,
{
    let expected = From::DATA_TYPE.to_string();
    match field.data_type() {
        element if element == &From::DATA_TYPE => {
            let values = downcast::<PrimitiveArray<From>>(field, column, &expected)?;
            Ok(Some(Arc::new(convert(values))))
        }
        DataType::FixedSizeList(item, size) if item.data_type() == &From::DATA_TYPE => {
            let list = downcast::<FixedSizeListArray>(field, column, "FixedSizeList")?;
            let values = downcast::<PrimitiveArray<From>>(field, list.values(), &expected)?;
            let item = Arc::new(item.as_ref().clone().with_data_type(To::DATA_TYPE));
            Ok(Some(Arc::new(FixedSizeListArray::try_new(
                item,
                *size,
                Arc::new(convert(values)),
                list.nulls().cloned(),
            )?)))
        }
        _ => Ok(None),
    }
}

/// FP32 to FP16 over the raw buffer with half's vectorised conversion, saturating finite
/// values beyond ±65504.
#[allow(
    clippy::indexing_slicing,
    reason = "`src` is a chunk of at most CHUNK values, the length of `clamped`"
)]
fn to_f16(values: &Float32Array) -> Float16Array {
    let mut out = vec![f16::ZERO; values.len()];
    let mut clamped = [0f32; CHUNK];
    for (dst, src) in out.chunks_mut(CHUNK).zip(values.values().chunks(CHUNK)) {
        let clamped = &mut clamped[..src.len()];
        for (c, &v) in clamped.iter_mut().zip(src) {
            *c = if v.is_finite() {
                v.clamp(-F16_MAX, F16_MAX)
            } else {
                v
            };
        }
        dst.convert_from_f32_slice(clamped);
    }
    Float16Array::new(out.into(), values.nulls().cloned())
}

/// FP16 to FP32 (exact) over the raw buffer.
fn to_f32(values: &Float16Array) -> Float32Array {
    let mut out = vec![0f32; values.len()];
    values.values().convert_to_f32_slice(&mut out);
    Float32Array::new(out.into(), values.nulls().cloned())
}

/// `field` retyped to `data_type`, with `how` (and the sparse row size) added to its metadata.
fn tagged(field: &Field, data_type: &DataType, how: Compression, size: Option<i32>) -> Field {
    let mut metadata = field.metadata().clone();
    metadata.insert(COMPRESSION_KEY.to_string(), how.tag().to_string());
    if let Some(size) = size {
        metadata.insert(SIZE_KEY.to_string(), size.to_string());
    }
    field
        .clone()
        .with_data_type(data_type.clone())
        .with_metadata(metadata)
}

fn downcast<'a, A: Array + 'static>(
    field: &Field,
    array: &'a ArrayRef,
    expected: &str,
) -> DataflowResult<&'a A> {
    array
        .as_any()
        .downcast_ref::<A>()
        .ok_or_else(|| DataflowError::schema(field.name(), expected, array.data_type().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::to_ipc_bytes;
    use crate::tensor::{tensor_column, tensor_field, SHAPE_KEY};
    use arrow_array::cast::AsArray;
    use arrow_array::{Int64Array, StringArray};
    use arrow_buffer::NullBuffer;

    /// Deterministic xorshift values in `[0, 1)`.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f32 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 40) as f32 / (1u64 << 24) as f32
        }
    }

    /// `rows × len` ReLU-like activations, `zeros` of them (a fraction) exactly zero.
    fn activations(rng: &mut Rng, count: usize, zeros: f32) -> Vec<f32> {
        (0..count)
            .map(|_| {
                if rng.next() < zeros {
                    0.0
                } else {
                    rng.next() * 6.0
                }
            })
            .collect()
    }

    fn tensor(name: &str, shape: &[usize], values: Vec<f32>) -> (Field, ArrayRef) {
        let field = tensor_field(name, DataType::Float32, shape);
        let column = tensor_column::<Float32Type>(&field, values).unwrap();
        (field, column)
    }

    fn batch_of(columns: Vec<(Field, ArrayRef)>) -> RecordBatch {
        let (fields, columns): (Vec<_>, Vec<_>) = columns.into_iter().unzip();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
    }

    fn labels(rows: usize) -> (Field, ArrayRef) {
        let labels: Vec<String> = (0..rows).map(|r| format!("camera-{r}")).collect();
        (
            Field::new("camera_id", DataType::Utf8, false),
            Arc::new(StringArray::from(labels)),
        )
    }

    /// A nullable tensor column: the list's rows marked null where `valid` is false.
    fn with_row_nulls(field: Field, column: &ArrayRef, valid: Vec<bool>) -> (Field, ArrayRef) {
        let list = column.as_fixed_size_list();
        let DataType::FixedSizeList(item, size) = field.data_type().clone() else {
            unreachable!()
        };
        let column = FixedSizeListArray::try_new(
            item,
            size,
            list.values().clone(),
            Some(NullBuffer::from(valid)),
        )
        .unwrap();
        (field.with_nullable(true), Arc::new(column))
    }

    /// Values of a Float32 column or a Float32 tensor column.
    fn f32_values(column: &ArrayRef) -> &[f32] {
        match column.as_fixed_size_list_opt() {
            Some(list) => list.values().as_primitive::<Float32Type>().values(),
            None => column.as_primitive::<Float32Type>().values(),
        }
    }

    /// Largest |decoded - original| / max(|original|, 2^-14) over two FP32 columns.
    fn max_relative_error(original: &ArrayRef, decoded: &ArrayRef) -> f32 {
        f32_values(original)
            .iter()
            .zip(f32_values(decoded))
            .map(|(a, b)| (a - b).abs() / a.abs().max(2f32.powi(-14)))
            .fold(0.0, f32::max)
    }

    #[test]
    fn fp16_round_trip_is_within_half_precision_and_restores_the_schema() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let rows = 8;
        let signed: Vec<f32> = (0..rows).map(|_| rng.next() * 20.0 - 10.0).collect();
        let scores = Float32Array::new(
            signed.into(),
            Some(NullBuffer::from(vec![
                true, true, false, true, true, true, true, false,
            ])),
        );
        let (field, column) = tensor(
            "features",
            &[4, 8, 8],
            activations(&mut rng, rows * 256, 0.5),
        );
        let features = with_row_nulls(field, &column, (0..rows).map(|r| r != 3).collect());
        let batch = batch_of(vec![
            labels(rows),
            (
                Field::new("score", DataType::Float32, true),
                Arc::new(scores),
            ),
            features,
            (
                Field::new("frame", DataType::Int64, false),
                Arc::new(Int64Array::from_iter_values(0..rows as i64)),
            ),
        ]);

        let wire = encode(&batch, Compression::Fp16).unwrap();
        let score = wire.schema().field(1).clone();
        assert_eq!(score.data_type(), &DataType::Float16);
        assert_eq!(score.metadata()[COMPRESSION_KEY], "fp16");
        let features = wire.schema().field(2).clone();
        assert_eq!(
            features.data_type(),
            &DataType::FixedSizeList(
                Arc::new(Field::new_list_field(DataType::Float16, false)),
                256
            )
        );
        assert_eq!(features.metadata()[SHAPE_KEY], "4,8,8");
        assert_eq!(wire.column(1).nulls(), batch.column(1).nulls());
        assert_eq!(wire.column(2).nulls(), batch.column(2).nulls());
        for untouched in [0, 3] {
            assert!(Arc::ptr_eq(wire.column(untouched), batch.column(untouched)));
        }

        let back = decode(&wire).unwrap();
        assert_eq!(back.schema(), batch.schema());
        for column in [1, 2] {
            assert_eq!(back.column(column).nulls(), batch.column(column).nulls());
            let error = max_relative_error(batch.column(column), back.column(column));
            eprintln!("fp16 max relative error, column {column}: {error:e}");
            assert!(error <= 2f32.powi(-11), "column {column}: {error}");
        }
        for untouched in [0, 3] {
            assert!(Arc::ptr_eq(back.column(untouched), batch.column(untouched)));
        }
    }

    #[test]
    fn fp16_saturates_beyond_its_range_and_keeps_special_values() {
        let values = vec![1e6, -1e6, 65504.0, f32::INFINITY, f32::NAN, 1e-8, -0.0];
        let batch = batch_of(vec![(
            Field::new("x", DataType::Float32, false),
            Arc::new(Float32Array::from(values)),
        )]);
        let back = decode(&encode(&batch, Compression::Fp16).unwrap()).unwrap();
        let back = back.column(0).as_primitive::<Float32Type>().values();
        assert_eq!(&back[..4], &[65504.0, -65504.0, 65504.0, f32::INFINITY]);
        assert!(back[4].is_nan());
        assert!((back[5] - 1e-8).abs() <= 2f32.powi(-25));
        assert_eq!(back[6].to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn sparse_round_trip_is_exact_and_leaves_dense_columns_alone() {
        let mut rng = Rng(42);
        let rows = 6;
        let mut mostly_zero = activations(&mut rng, rows * 64, 0.8);
        mostly_zero[64..128].fill(0.0); // an all-zero row
        mostly_zero[5] = -0.0; // not +0.0: kept bit for bit
        mostly_zero[7] = f32::NAN;
        let (field, column) = tensor("activations", &[4, 4, 4], mostly_zero);
        let sparse_in = with_row_nulls(field, &column, (0..rows).map(|r| r != 4).collect());
        let dense_in = tensor("embedding", &[16], activations(&mut rng, rows * 16, 0.2));
        let scalar = (
            Field::new("score", DataType::Float32, false),
            Arc::new(Float32Array::from(vec![0.0; rows])) as ArrayRef,
        );
        let batch = batch_of(vec![sparse_in, dense_in, scalar, labels(rows)]);

        let wire = encode(&batch, Compression::Sparse).unwrap();
        let sparse = wire.schema().field(0).clone();
        assert!(matches!(sparse.data_type(), DataType::List(_)));
        assert_eq!(sparse.metadata()[COMPRESSION_KEY], "sparse");
        assert_eq!(sparse.metadata()[SIZE_KEY], "64");
        assert_eq!(sparse.metadata()[SHAPE_KEY], "4,4,4");
        let list = wire.column(0).as_list::<i32>();
        assert_eq!(list.value_length(1), 0, "all-zero row");
        assert!(list.is_null(4));
        for untouched in 1..4 {
            assert_eq!(
                wire.schema().field(untouched),
                batch.schema().field(untouched)
            );
            assert!(Arc::ptr_eq(wire.column(untouched), batch.column(untouched)));
        }

        let back = decode(&wire).unwrap();
        assert_eq!(back.schema(), batch.schema());
        assert_eq!(back, batch);
        let valid_bits = |column: &ArrayRef| -> Vec<u32> {
            let values = f32_values(column);
            (0..rows)
                .filter(|r| *r != 4)
                .flat_map(|r| values[r * 64..(r + 1) * 64].iter().map(|v| v.to_bits()))
                .collect()
        };
        assert_eq!(valid_bits(back.column(0)), valid_bits(batch.column(0)));
    }

    #[test]
    fn sliced_tensors_encode_only_their_rows() {
        let mut rng = Rng(7);
        let batch = batch_of(vec![tensor("t", &[32], activations(&mut rng, 5 * 32, 0.9))]);
        let sliced = batch.slice(1, 3);
        for how in [Compression::Fp16, Compression::Sparse] {
            let back = decode(&encode(&sliced, how).unwrap()).unwrap();
            assert_eq!(back.num_rows(), 3);
            assert_eq!(back.schema(), sliced.schema());
            assert!(max_relative_error(sliced.column(0), back.column(0)) <= 2f32.powi(-11));
        }
    }

    #[test]
    fn batches_without_compression_metadata_decode_to_themselves() {
        let batch = batch_of(vec![tensor("t", &[2], vec![1.0, 0.0, 0.0, 0.0])]);
        let plain = encode(&batch, Compression::None).unwrap();
        assert!(Arc::ptr_eq(plain.column(0), batch.column(0)));
        assert!(Arc::ptr_eq(
            decode(&batch).unwrap().column(0),
            batch.column(0)
        ));
        // Encoding twice leaves encoded columns alone.
        let once = encode(&batch, Compression::Fp16).unwrap();
        let twice = encode(&once, Compression::Sparse).unwrap();
        assert_eq!(twice, once);
    }

    #[test]
    fn sparse_indices_out_of_range_are_a_schema_error() {
        let batch = batch_of(vec![tensor(
            "t",
            &[8],
            vec![0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0],
        )]);
        let wire = encode(&batch, Compression::Sparse).unwrap();
        let mut metadata = wire.schema().field(0).metadata().clone();
        metadata.insert(SIZE_KEY.to_string(), "2".to_string());
        let field = wire.schema().field(0).clone().with_metadata(metadata);
        let corrupt = batch_of(vec![(field, wire.column(0).clone())]);
        let error = decode(&corrupt).unwrap_err().to_string();
        assert!(error.contains("indices below 2"), "{error}");
    }

    #[test]
    fn both_encodings_shrink_a_mostly_zero_activation_tensor() {
        let mut rng = Rng(2024);
        let batch = batch_of(vec![
            labels(1),
            tensor(
                "activation",
                &[32, 28, 28],
                activations(&mut rng, 32 * 28 * 28, 0.7),
            ),
        ]);
        let bytes = |how| to_ipc_bytes(&encode(&batch, how).unwrap()).unwrap().len();
        let (none, fp16, sparse) = (
            bytes(Compression::None),
            bytes(Compression::Fp16),
            bytes(Compression::Sparse),
        );
        eprintln!("1×(32×28×28), 70% zeros, IPC bytes: none {none}, fp16 {fp16}, sparse {sparse}");
        assert!(fp16 * 100 < none * 55, "fp16 {fp16} vs {none}");
        assert!(sparse * 100 < none * 70, "sparse {sparse} vs {none}");
        for how in [Compression::Fp16, Compression::Sparse] {
            let back = decode(&encode(&batch, how).unwrap()).unwrap();
            assert_eq!(back.column(0), batch.column(0));
            assert_eq!(back.schema(), batch.schema());
        }
    }
}
