//! `schema: { name: Type, … }`: a Python stage's declared output columns, in order.

use std::fmt;
use std::str::FromStr;

use arrow_schema::{DataType, Field, Schema};
use riffle_dataflow::{DataflowError, DataflowResult};
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// Column names and Arrow type names, in the file's order.
#[derive(Clone, Debug, PartialEq)]
pub struct DeclaredSchema(pub Vec<(String, String)>);

impl DeclaredSchema {
    /// The Arrow schema (every column nullable); a type name Arrow does not know is an
    /// error at `schema.<name>`.
    pub fn to_schema(&self) -> DataflowResult<Schema> {
        let fields = self
            .0
            .iter()
            .map(|(name, ty)| {
                DataType::from_str(ty)
                    .map(|t| Field::new(name, t, true))
                    .map_err(|_| {
                        DataflowError::Config(format!(
                            "python: `{ty}` is not an Arrow type name (expected e.g. Int64, \
                             Float32, Utf8, Boolean, List(Float32))"
                        ))
                        .at(format!("schema.{name}"))
                    })
            })
            .collect::<DataflowResult<Vec<_>>>()?;
        Ok(Schema::new(fields))
    }
}

impl<'de> Deserialize<'de> for DeclaredSchema {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Columns;
        impl<'de> Visitor<'de> for Columns {
            type Value = DeclaredSchema;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of column names to Arrow type names")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut columns = Vec::new();
                while let Some(entry) = map.next_entry::<String, String>()? {
                    columns.push(entry);
                }
                Ok(DeclaredSchema(columns))
            }
        }
        d.deserialize_map(Columns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_columns_keep_their_order_and_bad_type_names_are_located() {
        let s: DeclaredSchema = serde_json::from_str(
            r#"{"track_id": "Int64", "label": "Utf8", "xs": "List(Float32)"}"#,
        )
        .unwrap();
        let schema = s.to_schema().unwrap();
        let names: Vec<_> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["track_id", "label", "xs"]);
        assert!(matches!(schema.field(2).data_type(), DataType::List(_)));
        let bad = DeclaredSchema(vec![("n".into(), "Integer".into())]);
        let e = bad.to_schema().unwrap_err();
        assert_eq!(e.located().0, Some("schema.n"));
        assert!(
            e.to_string()
                .contains("`Integer` is not an Arrow type name"),
            "{e}"
        );
    }
}
