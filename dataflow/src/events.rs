//! Events as records: list columns of the results (a line counter's crossings, a zone's entries
//! and exits) turned into one row per event, for a sink of their own (`events:` in a pipeline).
//!
//! An event row holds the `keep` columns of its result row (camera, frame, time), `event_source`
//! (the list column it came from) and every field of the list's structs; fields one column's
//! structs lack are null in its rows.
//!
//! ```
//! use std::sync::Arc;
//! use arrow_array::{Array, ListArray, RecordBatch, StringArray, Int64Array, StructArray};
//! use arrow_array::cast::AsArray;
//! use arrow_buffer::OffsetBuffer;
//! use arrow_schema::{DataType, Field, Fields};
//! use riffle_dataflow::events::EventsSpec;
//!
//! let fields = Fields::from(vec![Field::new("track_id", DataType::Int64, true)]);
//! let structs = StructArray::new(fields.clone(), vec![Arc::new(Int64Array::from(vec![7, 8, 9])) as _], None);
//! let events = ListArray::new(
//!     Arc::new(Field::new("item", DataType::Struct(fields), true)),
//!     OffsetBuffer::from_lengths([2, 0, 1]),
//!     Arc::new(structs),
//!     None,
//! );
//! let results = RecordBatch::try_from_iter(vec![
//!     ("camera_id", Arc::new(StringArray::from(vec!["a", "a", "b"])) as _),
//!     ("line_events", Arc::new(events) as _),
//! ])?;
//! let spec = EventsSpec { from: vec!["line_events".into()], keep: vec!["camera_id".into()] };
//! let schema = spec.schema(&results.schema()).unwrap();
//! let rows = spec.extract(&results, &schema)?;
//! assert_eq!(rows.num_rows(), 3);
//! let cameras = rows.column(0).as_string::<i32>();
//! assert_eq!((cameras.value(0), cameras.value(2)), ("a", "b"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{new_null_array, Array, ArrayRef, RecordBatch, StringArray, UInt32Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::error::{DataflowError, DataflowResult};

/// The column naming the list an event came from.
pub const EVENT_SOURCE: &str = "event_source";

/// Which list columns hold events, and which columns of their row go with each event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventsSpec {
    pub from: Vec<String>,
    pub keep: Vec<String>,
}

impl EventsSpec {
    /// The event rows' schema for results of schema `results`, or what is wrong (a column
    /// missing or not a list of structs, a field typed differently in two lists).
    pub fn schema(&self, results: &Schema) -> Result<SchemaRef, String> {
        let mut fields: Vec<Field> = Vec::new();
        for name in &self.keep {
            let f = results
                .field_with_name(name)
                .map_err(|_| format!("keep: no column `{name}` in the results"))?;
            fields.push(f.as_ref().clone().with_nullable(true));
        }
        fields.push(Field::new(EVENT_SOURCE, DataType::Utf8, false));
        let keep_and_source = fields.len();
        for name in &self.from {
            let item = match results.field_with_name(name).map(|f| f.data_type()) {
                Ok(DataType::List(item)) => item,
                Ok(other) => {
                    return Err(format!(
                        "from: `{name}` is {other}, expected a list of structs (as `line_count` \
                         and `zone` write their events)"
                    ))
                }
                Err(_) => {
                    return Err(format!(
                        "from: no column `{name}` in the results (keep it in the last `select`)"
                    ))
                }
            };
            let DataType::Struct(members) = item.data_type() else {
                return Err(format!(
                    "from: `{name}` is a list of {}, expected a list of structs",
                    item.data_type()
                ));
            };
            for m in members.iter() {
                match fields.iter().position(|f| f.name() == m.name()) {
                    Some(at) if at < keep_and_source => {
                        return Err(format!(
                            "from: `{name}`'s field `{}` has the name of a kept column",
                            m.name()
                        ))
                    }
                    Some(at) => {
                        let seen = fields.get(at).map(|f| f.data_type().clone());
                        if seen.as_ref() != Some(m.data_type()) {
                            return Err(format!(
                                "from: field `{}` is {} in `{name}` but {} in an earlier list",
                                m.name(),
                                m.data_type(),
                                seen.map_or("?".into(), |t| t.to_string())
                            ));
                        }
                    }
                    None => fields.push(m.as_ref().clone().with_nullable(true)),
                }
            }
        }
        Ok(Arc::new(Schema::new(fields)))
    }

    /// One row per event of `batch` (a results batch), in `schema` (from [`EventsSpec::schema`]).
    pub fn extract(&self, batch: &RecordBatch, schema: &SchemaRef) -> DataflowResult<RecordBatch> {
        let mut parts: Vec<RecordBatch> = Vec::with_capacity(self.from.len());
        for name in &self.from {
            let column = batch
                .column_by_name(name)
                .ok_or_else(|| DataflowError::schema(name, "a list of events", "no such column"))?;
            let list = column
                .as_list_opt::<i32>()
                .ok_or_else(|| DataflowError::schema(name, "a list of events", "not a list"))?;
            let mut rows: Vec<u32> = Vec::new();
            let mut items: Vec<u32> = Vec::new();
            let offsets = list.value_offsets();
            for row in 0..list.len() {
                if list.is_null(row) {
                    continue;
                }
                let (Some(&start), Some(&end)) = (offsets.get(row), offsets.get(row + 1)) else {
                    continue;
                };
                for item in start..end {
                    rows.push(row as u32);
                    items.push(item as u32);
                }
            }
            let rows = UInt32Array::from(rows);
            let items = UInt32Array::from(items);
            let structs = list.values().as_struct_opt().ok_or_else(|| {
                DataflowError::schema(name, "a list of structs", "a list of something else")
            })?;
            let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
            for field in schema.fields() {
                let f = field.name();
                let column = if self.keep.contains(f) {
                    let kept = batch.column_by_name(f).ok_or_else(|| {
                        DataflowError::schema(f, "a kept column", "no such column")
                    })?;
                    arrow_select::take::take(kept, &rows, None)?
                } else if f == EVENT_SOURCE {
                    Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
                        name.as_str(),
                        rows.len(),
                    )))
                } else {
                    match structs.column_by_name(f) {
                        Some(values) => arrow_select::take::take(values, &items, None)?,
                        None => new_null_array(field.data_type(), rows.len()),
                    }
                };
                columns.push(column);
            }
            parts.push(RecordBatch::try_new(schema.clone(), columns)?);
        }
        Ok(arrow_select::concat::concat_batches(schema, &parts)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int64Array, ListArray, StructArray};
    use arrow_buffer::OffsetBuffer;
    use arrow_schema::Fields;

    fn list(fields: Vec<Field>, columns: Vec<ArrayRef>, lengths: Vec<usize>) -> ArrayRef {
        let fields = Fields::from(fields);
        let structs = StructArray::new(fields.clone(), columns, None);
        Arc::new(ListArray::new(
            Arc::new(Field::new("item", DataType::Struct(fields), true)),
            OffsetBuffer::from_lengths(lengths),
            Arc::new(structs),
            None,
        ))
    }

    fn results() -> RecordBatch {
        let line = list(
            vec![
                Field::new("line", DataType::Utf8, false),
                Field::new("track_id", DataType::Int64, true),
            ],
            vec![
                Arc::new(StringArray::from(vec!["door", "door"])),
                Arc::new(Int64Array::from(vec![3, 4])),
            ],
            vec![0, 2],
        );
        let zone = list(
            vec![
                Field::new("zone", DataType::Utf8, false),
                Field::new("track_id", DataType::Int64, true),
                Field::new("dwell_ms", DataType::Int64, true),
            ],
            vec![
                Arc::new(StringArray::from(vec!["till"])),
                Arc::new(Int64Array::from(vec![5])),
                Arc::new(Int64Array::from(vec![1200])),
            ],
            vec![1, 0],
        );
        RecordBatch::try_from_iter(vec![
            (
                "camera_id",
                Arc::new(StringArray::from(vec!["a", "b"])) as ArrayRef,
            ),
            (
                "frame",
                Arc::new(Int64Array::from(vec![10, 11])) as ArrayRef,
            ),
            ("line_events", line),
            ("zone_events", zone),
        ])
        .unwrap()
    }

    #[test]
    fn each_event_becomes_a_row_with_its_frame_and_the_union_of_fields() {
        let spec = EventsSpec {
            from: vec!["line_events".into(), "zone_events".into()],
            keep: vec!["camera_id".into(), "frame".into()],
        };
        let batch = results();
        let schema = spec.schema(&batch.schema()).unwrap();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(
            names,
            [
                "camera_id",
                "frame",
                "event_source",
                "line",
                "track_id",
                "zone",
                "dwell_ms"
            ]
        );
        let rows = spec.extract(&batch, &schema).unwrap();
        assert_eq!(rows.num_rows(), 3);
        let col = |n: &str| rows.column_by_name(n).unwrap().clone();
        let frames = col("frame");
        let frames = frames.as_primitive::<arrow_array::types::Int64Type>();
        assert_eq!(frames.values().to_vec(), [11, 11, 10]);
        let tracks = col("track_id");
        let tracks = tracks.as_primitive::<arrow_array::types::Int64Type>();
        assert_eq!(tracks.values().to_vec(), [3, 4, 5]);
        let dwell = col("dwell_ms");
        assert!(dwell.is_null(0) && dwell.is_null(1) && !dwell.is_null(2));
        let source = col(EVENT_SOURCE);
        assert_eq!(source.as_string::<i32>().value(2), "zone_events");
    }

    #[test]
    fn a_missing_or_mistyped_column_is_named() {
        let batch = results();
        let spec = |from: &str, keep: &str| EventsSpec {
            from: vec![from.into()],
            keep: vec![keep.into()],
        };
        let e = spec("zone_counts", "camera_id")
            .schema(&batch.schema())
            .unwrap_err();
        assert!(e.contains("no column `zone_counts`"), "{e}");
        let e = spec("frame", "camera_id")
            .schema(&batch.schema())
            .unwrap_err();
        assert!(e.contains("expected a list of structs"), "{e}");
        let e = spec("line_events", "pts_ms")
            .schema(&batch.schema())
            .unwrap_err();
        assert!(e.contains("no column `pts_ms`"), "{e}");
    }
}
