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

/// A column declared with `schema:`: its type, and whether a record may leave it out or null
/// (`int64?`). Columns are required unless so declared.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(try_from = "String")]
pub struct DeclaredColumn {
    pub data: ColumnType,
    pub nullable: bool,
}

impl TryFrom<String> for DeclaredColumn {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        let (name, nullable) = match text.strip_suffix('?') {
            Some(name) => (name, true),
            None => (text.as_str(), false),
        };
        let data = match name {
            "string" => ColumnType::String,
            "int64" => ColumnType::Int64,
            "float64" => ColumnType::Float64,
            "bool" => ColumnType::Bool,
            _ => {
                return Err(format!(
                    "unknown column type `{text}`: expected string, int64, float64 or bool, with `?` if it may be missing"
                ))
            }
        };
        Ok(DeclaredColumn { data, nullable })
    }
}

/// The schema of declared columns (name → type; the Arrow fields are nullable, required
/// columns are checked per record by the decoder); `None` when none are declared.
pub fn declared_schema(declared: &BTreeMap<String, DeclaredColumn>) -> Option<SchemaRef> {
    if declared.is_empty() {
        return None;
    }
    Some(Arc::new(Schema::new(
        declared
            .iter()
            .map(|(name, c)| Field::new(name, c.data.data_type(), true))
            .collect::<Vec<_>>(),
    )))
}

/// The declared columns a record must have.
pub fn declared_required(declared: &BTreeMap<String, DeclaredColumn>) -> Vec<String> {
    declared
        .iter()
        .filter(|(_, c)| !c.nullable)
        .map(|(name, _)| name.clone())
        .collect()
}
