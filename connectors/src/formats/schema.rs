//! Declared column types, and text (header values) parsed into typed columns.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, Float64Array, Int64Array, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use serde::Deserialize;

/// Types for declared columns (`schema:` and `header_columns:` of a Kafka source).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ColumnType {
    String,
    Int64,
    Float64,
    Bool,
}

impl ColumnType {
    /// The Arrow type of a column declared with this type.
    pub fn data_type(self) -> DataType {
        match self {
            ColumnType::String => DataType::Utf8,
            ColumnType::Int64 => DataType::Int64,
            ColumnType::Float64 => DataType::Float64,
            ColumnType::Bool => DataType::Boolean,
        }
    }

    /// A column of this type from text values; text that does not parse becomes null (header
    /// values are advisory, not records to reject).
    pub fn parse_column<'a>(self, texts: impl Iterator<Item = Option<&'a str>>) -> ArrayRef {
        match self {
            ColumnType::String => Arc::new(StringArray::from_iter(texts)),
            ColumnType::Int64 => Arc::new(Int64Array::from_iter(
                texts.map(|s| s.and_then(|s| s.trim().parse::<i64>().ok())),
            )),
            ColumnType::Float64 => Arc::new(Float64Array::from_iter(
                texts.map(|s| s.and_then(|s| s.trim().parse::<f64>().ok())),
            )),
            ColumnType::Bool => Arc::new(BooleanArray::from_iter(texts.map(|s| {
                s.and_then(|s| match s.trim().to_ascii_lowercase().as_str() {
                    "true" => Some(true),
                    "false" => Some(false),
                    _ => None,
                })
            }))),
        }
    }
}

/// The schema of declared columns (name → type, all nullable); `None` when none are declared.
pub fn declared_schema(declared: &BTreeMap<String, ColumnType>) -> Option<SchemaRef> {
    if declared.is_empty() {
        return None;
    }
    Some(Arc::new(Schema::new(
        declared
            .iter()
            .map(|(name, t)| Field::new(name, t.data_type(), true))
            .collect::<Vec<_>>(),
    )))
}
