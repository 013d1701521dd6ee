//! Declared column types, and text (header values) parsed into typed columns.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use arrow_array::{
    ArrayRef, BooleanArray, Float32Array, Float64Array, Int32Array, Int64Array, StringArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use riffle_dataflow::tensor::SHAPE_KEY;
use serde::Deserialize;

/// Types for declared columns (`schema:` and `header_columns:` of a Kafka source).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ColumnType {
    String,
    Int32,
    Int64,
    Float32,
    Float64,
    Bool,
}

/// How the accepted types read in a config error.
const ACCEPTED: &str = "string, int32, int64, float32, float64, bool, or a fixed-size list of \
                        numbers such as float32[4] or int64[80]; with `?` if it may be missing";

impl ColumnType {
    /// The Arrow type of a column declared with this type.
    pub fn data_type(self) -> DataType {
        match self {
            ColumnType::String => DataType::Utf8,
            ColumnType::Int32 => DataType::Int32,
            ColumnType::Int64 => DataType::Int64,
            ColumnType::Float32 => DataType::Float32,
            ColumnType::Float64 => DataType::Float64,
            ColumnType::Bool => DataType::Boolean,
        }
    }

    fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "string" => ColumnType::String,
            "int32" => ColumnType::Int32,
            "int64" => ColumnType::Int64,
            "float32" => ColumnType::Float32,
            "float64" => ColumnType::Float64,
            "bool" => ColumnType::Bool,
            _ => return None,
        })
    }

    fn is_number(self) -> bool {
        !matches!(self, ColumnType::String | ColumnType::Bool)
    }

    /// A column of this type from text values; text that does not parse becomes null (header
    /// values are advisory, not records to reject).
    pub fn parse_column<'a>(self, texts: impl Iterator<Item = Option<&'a str>>) -> ArrayRef {
        fn parsed<'a, T: std::str::FromStr, I: Iterator<Item = Option<&'a str>>>(
            texts: I,
        ) -> impl Iterator<Item = Option<T>> + use<'a, T, I> {
            texts.map(|s| s.and_then(|s| s.trim().parse::<T>().ok()))
        }
        match self {
            ColumnType::String => Arc::new(StringArray::from_iter(texts)),
            ColumnType::Int32 => Arc::new(Int32Array::from_iter(parsed::<i32, _>(texts))),
            ColumnType::Int64 => Arc::new(Int64Array::from_iter(parsed::<i64, _>(texts))),
            ColumnType::Float32 => Arc::new(Float32Array::from_iter(parsed::<f32, _>(texts))),
            ColumnType::Float64 => Arc::new(Float64Array::from_iter(parsed::<f64, _>(texts))),
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

/// A column declared with `schema:`: its type (a scalar, or a fixed-size list of numbers,
/// `float32[4]`), and whether a record may leave it out or null (`int64?`). Columns are
/// required unless so declared.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(try_from = "String")]
pub struct DeclaredColumn {
    /// The type of the value, or of each element of a list.
    pub data: ColumnType,
    /// `Some(k)`: a list of exactly `k` elements (`float32[k]`).
    pub list: Option<usize>,
    pub nullable: bool,
}

impl DeclaredColumn {
    /// The Arrow field of a column declared so. A list is a tensor column (`FixedSizeList`
    /// with its per-row shape, as `riffle_dataflow::tensor` reads it), so a model can take it
    /// as is. Fields are nullable: required columns are checked per record by the decoder.
    pub fn field(&self, name: &str) -> Field {
        match self.list {
            None => Field::new(name, self.data.data_type(), true),
            Some(k) => {
                let item = Arc::new(Field::new_list_field(self.data.data_type(), false));
                // `k` fits: parsing refuses lengths over i32::MAX.
                let size = i32::try_from(k).unwrap_or(i32::MAX);
                Field::new(name, DataType::FixedSizeList(item, size), true)
                    .with_metadata(HashMap::from([(SHAPE_KEY.to_string(), k.to_string())]))
            }
        }
    }
}

impl fmt::Display for DeclaredColumn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The variant names are the type names, lowercased.
        write!(f, "{}", format!("{:?}", self.data).to_ascii_lowercase())?;
        if let Some(k) = self.list {
            write!(f, "[{k}]")?;
        }
        if self.nullable {
            write!(f, "?")?;
        }
        Ok(())
    }
}

impl TryFrom<String> for DeclaredColumn {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        let unknown = || format!("unknown column type `{text}`: expected {ACCEPTED}");
        let trimmed = text.trim();
        let (name, nullable) = match trimmed.strip_suffix('?') {
            Some(name) => (name, true),
            None => (trimmed, false),
        };
        let (element, list) = match name.strip_suffix(']').and_then(|n| n.split_once('[')) {
            Some((element, length)) => {
                let k = length
                    .trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|k| *k >= 1 && i32::try_from(*k).is_ok())
                    .ok_or_else(|| {
                        format!(
                            "column type `{text}`: a list length must be a whole number from 1 \
                             to {}",
                            i32::MAX
                        )
                    })?;
                (element.trim(), Some(k))
            }
            None => (name, None),
        };
        let data = ColumnType::parse(element).ok_or_else(unknown)?;
        if list.is_some() && !data.is_number() {
            return Err(format!(
                "column type `{text}`: a fixed-size list holds numbers (int32, int64, float32 or \
                 float64)"
            ));
        }
        Ok(DeclaredColumn {
            data,
            list,
            nullable,
        })
    }
}

/// The columns of a `schema:` block, in the order the pipeline file writes them (the order
/// the source's columns come out in).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeclaredSchema(Vec<(String, DeclaredColumn)>);

impl DeclaredSchema {
    pub fn columns(&self) -> &[(String, DeclaredColumn)] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn get(&self, name: &str) -> Option<&DeclaredColumn> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, c)| c)
    }

    /// The first column declared as a fixed-size list, which CSV cannot hold.
    pub fn first_list(&self) -> Option<(&str, &DeclaredColumn)> {
        self.0
            .iter()
            .find(|(_, c)| c.list.is_some())
            .map(|(n, c)| (n.as_str(), c))
    }
}

impl FromIterator<(String, DeclaredColumn)> for DeclaredSchema {
    fn from_iter<I: IntoIterator<Item = (String, DeclaredColumn)>>(iter: I) -> Self {
        DeclaredSchema(iter.into_iter().collect())
    }
}

impl<'de> Deserialize<'de> for DeclaredSchema {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = DeclaredSchema;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of column name to type, e.g. { user: string, score: float32 }")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<DeclaredSchema, A::Error> {
                use serde::de::Error;
                let mut columns: Vec<(String, DeclaredColumn)> = Vec::new();
                while let Some(name) = map.next_key::<String>()? {
                    // Converted inside the value's deserializer, so an error is located at the
                    // value; it names its column, as a schema may declare dozens.
                    let column = map.next_value_seed(Typed(&name))?;
                    if columns.iter().any(|(n, _)| *n == name) {
                        return Err(A::Error::custom(format!(
                            "schema column `{name}` is declared twice"
                        )));
                    }
                    columns.push((name, column));
                }
                Ok(DeclaredSchema(columns))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// Deserializes the type of column `.0`.
struct Typed<'a>(&'a str);

impl<'de> serde::de::DeserializeSeed<'de> for Typed<'_> {
    type Value = DeclaredColumn;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<DeclaredColumn, D::Error> {
        use serde::de::Error;
        let text = String::deserialize(d)?;
        DeclaredColumn::try_from(text)
            .map_err(|e| D::Error::custom(format!("schema column `{}`: {e}", self.0)))
    }
}

/// The schema of declared columns, in declared order (see [`DeclaredColumn::field`]); `None`
/// when none are declared.
pub fn declared_schema(declared: &DeclaredSchema) -> Option<SchemaRef> {
    if declared.is_empty() {
        return None;
    }
    Some(Arc::new(Schema::new(
        declared
            .columns()
            .iter()
            .map(|(name, c)| c.field(name))
            .collect::<Vec<_>>(),
    )))
}

/// The declared columns a record must have.
pub fn declared_required(declared: &DeclaredSchema) -> Vec<String> {
    declared
        .columns()
        .iter()
        .filter(|(_, c)| !c.nullable)
        .map(|(name, _)| name.clone())
        .collect()
}
